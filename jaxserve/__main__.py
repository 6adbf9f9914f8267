"""`python -m jaxserve [flags]`: the main job, SGLang's launch_server on the embedded default (the tiny
gpt-oss target in jaxserve/assets/embedded with its EAGLE-3 head, radix cache on) unless `--model-path`
is given. Same flags as `python -m jaxserve.launch_server`. The host-only prefix-cache walkthrough of the
seed scenario is `python -m jaxserve.cache_demo`."""

import sys

from jaxserve.server.launch import main

sys.exit(main(sys.argv[1:]))
