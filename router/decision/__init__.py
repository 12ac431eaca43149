"""The routing decision: a request's language and domain (classify), the pools that may serve it in
order (policy, speed, canary) and the whole decision for one body (routing). Pure: no I/O to engines, no
telemetry."""
