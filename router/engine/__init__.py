"""The engine side: the HTTP client and its pools (engine_http, connections, upstream), replica health (backends), and
forwarding one request with failover, unary (proxy) or streamed (stream), with its bookkeeping (job)."""
