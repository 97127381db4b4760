"""Development tools around the daemon: the local stack, the datanode simulator, the demo.

Nothing in `metasrv`, `procedures` or `api` imports this package; the CLI loads it lazily,
only for the commands that need it (`metasrv stack`, `metasrv demo`).
"""
