"""`python -m jaxserve`: the main job. Until the server lands (issue #7) it plays the seed scenario through
the prefix caches (see jaxserve/cache_demo.py)."""

from jaxserve.cache_demo import main

main()
