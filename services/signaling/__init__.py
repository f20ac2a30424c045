"""`firsthop signaling`: the public HTTP + WebSocket API (docs/architecture.md §6).

Modules, from pure to I/O:

* `errors.py` — `Problem`, the one exception every layer raises for a 4xx/5xx reply;
* `placement.py` — pure: region steering (header, CIDR table, own region) and transceiver
  ranking (least loaded, draining and full ones skipped);
* `auth.py` — pure: API keys and HMAC-signed, short-lived, single-use client secrets;
* `ratelimit.py` — pure: token buckets per IP and per key, time injected;
* `stores.py` — Redis (sync client in worker threads) with in-memory fallback: the
  transceiver directory, the call map, the used-secret ledger;
* `transceivers.py` — the internal API client (httpx on Trio), transport errors translated;
* `calls.py` — create / patch / end a call: placement, failover, the call map;
* `app.py` and `ws.py` — the Quart-Trio routes; `main.py` — flags and `serve_signaling`.
"""
