"""Client-side tools for a running server (`python -m jaxserve.test.send_one`), as in `sglang.test`."""
