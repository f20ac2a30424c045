"""`firsthop bench setup`: offer -> connected, firsthop next to stock aiortc, same run.

firsthop: caller -> relay -> transceiver (ICE-lite, shared socket) with the offer sent to the
transceiver's internal API. Reference: a stock aiortc answerer (one socket per call, full ICE)
in its own process. Callers are a stock aiortc peer and headless Chromium (fake microphone),
each timing from "createOffer" to connectionState "connected" on the caller side. Calls run
one after another, the targets interleaved, so machine noise hits all alike. Chromium also
calls firsthop over ICE-TCP (`firsthop-tcp`: the answer offers only the relay's TCP
ingress, as a UDP-blocked network leaves it), reported against the same calls over UDP.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from firsthop.services.bench.procs import Stack
from firsthop.services.call.caller import Caller

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]

PAGE = b"""<!doctype html><html><body><script>
async function call(target) {
  const t0 = performance.now();
  const pc = new RTCPeerConnection({iceServers: []});
  const mic = await navigator.mediaDevices.getUserMedia({audio: true});
  mic.getTracks().forEach((t) => pc.addTrack(t, mic));
  window.marks = {};
  pc.oniceconnectionstatechange = () => {
    window.marks["ice_" + pc.iceConnectionState] = performance.now() - t0;
  };
  const connected = new Promise((res, rej) => {
    pc.onconnectionstatechange = () => {
      window.marks["pc_" + pc.connectionState] = performance.now() - t0;
      if (pc.connectionState === "connected") res(performance.now() - t0);
      if (pc.connectionState === "failed") rej(new Error("failed"));
    };
  });
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((res) => {
    if (pc.iceGatheringState === "complete") return res();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === "complete" && res();
  });
  window.marks.offer = performance.now() - t0;
  const r = await fetch("/offer?target=" + target, {method: "POST", body: pc.localDescription.sdp});
  const answer = await r.text();
  window.marks.answer = performance.now() - t0;
  await pc.setRemoteDescription({type: "answer", sdp: answer});
  const ms = await connected;
  pc.close(); mic.getTracks().forEach((t) => t.stop());
  return ms;
}
</script></body></html>"""


def _serve_page(targets: dict[str, Callable[[str], str]]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def do_POST(self) -> None:
            target = self.path.split("target=", 1)[1]
            offer = self.rfile.read(int(self.headers["Content-Length"])).decode()
            body = targets[target](offer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/sdp")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def _aiortc_call(signal: Callable[[str], str]) -> float:
    caller = Caller()

    async def via_thread(offer: str) -> str:
        return await asyncio.to_thread(signal, offer)

    try:
        await caller.start(via_thread)
        return await asyncio.wait_for(caller.wait_connected(), 15)
    finally:
        await caller.close()


def run(calls: int, *, chromium: bool = True, verbose: bool = False) -> dict[str, Any]:
    stack = Stack().start(stock=True)
    targets: dict[str, Callable[[str], str]] = {
        "firsthop": stack.offer_to_firsthop,
        "stock": stack.offer_to_stock,
    }
    samples: dict[str, list[float]] = {}
    try:
        for _ in range(calls):
            for name, signal in targets.items():
                ms = asyncio.run(_aiortc_call(signal)) * 1000
                samples.setdefault(f"aiortc->{name}", []).append(ms)
        if chromium:
            from playwright.sync_api import sync_playwright

            browser_targets: dict[str, Callable[[str], str]] = {
                **targets,
                "firsthop-tcp": functools.partial(stack.offer_to_firsthop, tcp_only=True),
            }
            server = _serve_page(browser_targets)
            try:
                with sync_playwright() as pw:
                    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                    page = browser.new_page()
                    page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
                    for _ in range(calls):
                        for name in browser_targets:
                            ms = page.evaluate(f"call('{name}')")
                            if verbose:
                                print(name, page.evaluate("window.marks"))
                            samples.setdefault(f"chromium->{name}", []).append(float(ms))
                    browser.close()
            finally:
                server.shutdown()
    finally:
        stack.stop()
    out: dict[str, Any] = {}
    for key, values in samples.items():
        out[key] = {
            "p50_ms": round(statistics.median(values), 1),
            "min_ms": round(min(values), 1),
            "max_ms": round(max(values), 1),
            "n": len(values),
        }
    for caller in ("aiortc", "chromium"):
        ours, ref = out.get(f"{caller}->firsthop"), out.get(f"{caller}->stock")
        if ours and ref:
            out[f"{caller}_delta_p50_ms"] = round(ours["p50_ms"] - ref["p50_ms"], 1)
    tcp, udp = out.get("chromium->firsthop-tcp"), out.get("chromium->firsthop")
    if tcp and udp:
        out["chromium_tcp_minus_udp_p50_ms"] = round(tcp["p50_ms"] - udp["p50_ms"], 1)
        out["chromium_tcp_over_udp_p50"] = round(tcp["p50_ms"] / udp["p50_ms"], 2)
    return out


def _main(args: argparse.Namespace) -> int:
    result = run(args.calls, chromium=not args.no_chromium)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"offer -> connected, {args.calls} calls each, interleaved (target: <= stock + 10 ms)")
    print(f"  {'caller -> answerer':<22}{'p50 ms':>9}{'min':>8}{'max':>8}")
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"  {key:<22}{value['p50_ms']:>9}{value['min_ms']:>8}{value['max_ms']:>8}")
    for caller in ("aiortc", "chromium"):
        if f"{caller}_delta_p50_ms" in result:
            print(f"  {caller}: firsthop - stock = {result[caller + '_delta_p50_ms']} ms (p50)")
    if "chromium_tcp_minus_udp_p50_ms" in result:
        print(
            f"  chromium: ICE-TCP - UDP = {result['chromium_tcp_minus_udp_p50_ms']} ms (p50), "
            f"x{result['chromium_tcp_over_udp_p50']}"
        )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("setup", help="call setup time: firsthop vs stock aiortc")
    p.add_argument("--calls", type=int, default=10, help="calls per caller and target")
    p.add_argument("--no-chromium", action="store_true", help="aiortc caller only")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
