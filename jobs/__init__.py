"""Jobs: the OpenAI Batch API (``/v1/files``, ``/v1/batches``), its store and its runner.

store.py / sqlite.py / postgres.py   files, batches and their lines (own connection, same database)
validate.py                          the input file's lines, checked before any runs
calls.py                             one line = one in-process call to the gateway's app; output lines
job.py                               the run of one batch: validate, run lines, finalize
runner.py                            the background runner: claims batches (leases), runs them
"""
