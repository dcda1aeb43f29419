"""Serving beyond one process: :mod:`pyengine.serve.ray` runs the server's app as Ray Serve
replicas (``pip install "pyengine[ray]"``). Nothing here imports Ray until that module is."""
