"""Speech recognition for the assistant: pocketsphinx with a small language model of its own.

pocketsphinx ships an en-US acoustic model, a 130k-word dictionary and a general language
model. On synthetic and telephone-like speech the general model guesses badly (espeak-ng's
"what time is it" comes out as "i"), so the decoder uses an n-gram model built at start-up
from `CORPUS` — the phrases the brain understands plus a few everyday ones — with the
dictionary cut down to its words. Recognition is then fast (~0.2 s for a short question on
one core) and mostly right on those phrases (16 of 24 espeak-ng renderings word for word, the
key word in nearly all); words outside the corpus are heard as the nearest ones in it.
Everything comes from the installed package; nothing is downloaded.

`Recognizer.transcribe` is blocking: the server runs it in a worker thread, one decoder per
thread at a time (a pocketsphinx decoder is not thread-safe).
"""

from __future__ import annotations

import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from firsthop.services.agent.assistant.audio import RATE, resample

ASR_RATE = 16000
LANGUAGE_WEIGHT = 10.0  # pocketsphinx's default is 6.5; the small model deserves more trust

CORPUS = """\
hello
hello there
hi there
hey
good morning
good afternoon
good evening
what time is it
what time is it now
what is the time
tell me the time
what day is it today
what is the date today
what can you do
how can you help me
what is your name
who are you
how are you
thank you
thanks
goodbye
bye
yes
no
please
can you hear me
say something
tell me a joke
the weather is nice today
"""


class Recognizer:
    """A pool of pocketsphinx decoders sharing one language model on disk."""

    def __init__(self, corpus: str = CORPUS) -> None:
        from pocketsphinx import get_model_path
        from pocketsphinx.lm import ArpaBoLM

        self._dir = tempfile.TemporaryDirectory(prefix="firsthop-asr-")
        root = Path(self._dir.name)
        lm = ArpaBoLM(text=corpus, case="lower", add_start=True)
        lm.compute()
        self.lm_path = root / "assistant.arpa"
        lm.write_file(str(self.lm_path))
        words = set(re.findall(r"[a-z']+", corpus.lower()))
        self.dict_path = root / "assistant.dict"
        with (
            open(get_model_path("en-us/cmudict-en-us.dict"), encoding="utf-8") as full,
            open(self.dict_path, "w", encoding="utf-8") as out,
        ):
            for line in full:
                word = re.sub(r"\(\d+\)$", "", line.split(" ", 1)[0])
                if word in words:
                    out.write(line)
        self._free: list[Any] = []
        self._lock = threading.Lock()
        self._release(self._decoder())  # load once now: a broken install fails at start-up

    def _decoder(self) -> Any:
        from pocketsphinx import Decoder

        with self._lock:
            if self._free:
                return self._free.pop()
        return Decoder(
            samprate=ASR_RATE,
            lm=str(self.lm_path),
            dict=str(self.dict_path),
            cmn="batch",  # normalise over the whole turn: no drift from earlier turns
            lw=LANGUAGE_WEIGHT,
            loglevel="FATAL",
        )

    def _release(self, decoder: Any) -> None:
        with self._lock:
            self._free.append(decoder)

    def transcribe(self, pcm24k: bytes) -> str:
        """Blocking: 24 kHz PCM16 in, the words heard out ("" for none)."""
        decoder = self._decoder()
        try:
            decoder.start_utt()
            decoder.process_raw(resample(pcm24k, RATE, ASR_RATE), full_utt=True)
            decoder.end_utt()
            hyp = decoder.hyp()
            return str(hyp.hypstr).strip() if hyp is not None else ""
        finally:
            self._release(decoder)

    def close(self) -> None:
        self._dir.cleanup()
