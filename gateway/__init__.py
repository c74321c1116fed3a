"""The life of one call without HTTP: the gateway's shared state, authentication, rate limits, the
pipeline (check, reserve, open with retries and fallbacks, relay, settle) and its reliability rules."""
