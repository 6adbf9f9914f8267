"""`python -m jaxserve.launch_server --model-path DIR [--port 30000] ...`: SGLang's launch command.

Flags: `python -m jaxserve.launch_server --help` (SGLang's names; see `jaxserve.server.args`). Without
`--model-path` the embedded default model is served.
"""

import sys

from jaxserve.server.launch import main

if __name__ == "__main__":
    sys.exit(main())
