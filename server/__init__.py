"""The HTTP server the gateway runs on: hypercorn, with a fast path installed over some of its
internals (:func:`server.serve.install_server_layer`), and the process around it (signals, workers,
the garbage collector's settings). It imports ``core`` only and knows no route of the gateway: the
app reaches what it adds through the ASGI scope's extensions (``core.types.RECEIVE_WATCH``)."""
