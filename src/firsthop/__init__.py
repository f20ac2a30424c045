"""firsthop: a WebRTC edge for real-time voice AI.

The code lives in the repository's two top-level folders, `services/` (the relay, the
transceiver, signaling, the agents, the CLI and benches) and `shared/` (wire codecs and what
every service uses). This package names them `firsthop.services` and `firsthop.shared`
(src/firsthop/ holds symlinks to them; an installed wheel holds the files themselves), so that installing
firsthop adds one top-level name to a user's site-packages, not two generic ones.
"""
