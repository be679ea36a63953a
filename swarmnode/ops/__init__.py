"""What an operator sees and every role shares: metrics, the HTTP API, status files, supervised jobs.

``metrics``: counters and gauges (Prometheus text). ``api``: the node's aiohttp API on 127.0.0.1.
``status``: the status file a running node writes. ``supervise``: supervised asyncio jobs.
"""
