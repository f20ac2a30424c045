"""`firsthop agent --kind assistant`: an offline voice assistant behind the Realtime protocol.

Modules by concept: `audio` (PCM16 helpers), `turns` (server VAD), `config` (session.update
and what is honoured), `commands` (what the core asks of I/O), `client_events` (one handler
per client event), `session` (the sans-IO session core), `brain` (rule-based answers),
`recognizer` (pocketsphinx), `voice` (piper / espeak-ng), `server` (the Trio WebSocket
server). docs/assistant.md describes models, licences and limits.
"""
