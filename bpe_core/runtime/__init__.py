"""The machinery every stage runs on (the lowest layer but ``errors``):

- ``budget``: the RAM budget as a plan (workers, chunk size, spilling), re-planned with real counts;
- ``workers``: the one thread pool of the data-parallel phases, ``pread`` input, signals;
- ``memmon``, ``profile``: memory of the process over time, phases, the profiling tool;
- ``progress``: the one kind of progress reporter (bar, plain lines, JSON lines);
- ``atomic``: temp file + rename outputs with the user's umask, stale temp files;
- ``cli``: one-line errors and exit codes of the command-line tools;
- ``lazy``: numpy imported on first use (a small run never imports it).
"""
