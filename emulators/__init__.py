"""Local emulators of the upstream providers: product code, used by the demo, the
benchmarks and the tests. Each is a small aiohttp app that checks auth like the real API, answers in
the real wire format with real usage numbers, and injects faults on request (see ``directives``)."""
