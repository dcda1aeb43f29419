"""Tokenizer throughput on 1 MB of mixed text, side by side with llama.cpp when available.

    python benchmarks/tokenizer_speed.py [--size-mb 1] [--model smollm2-135m --model gemma3-270m]
                                  [--repeat 3] [--vocab path.gguf ...]

The text (prose, code, CJK, emoji, whitespace runs; seeded, so every run sees the same
bytes) is tokenized with add_special=False, parse_special=False. "cold" is the first
encode of a fresh Tokenizer (empty word caches), "warm" the best of --repeat more.
With llama-cpp-python installed, llama.cpp's tokenizer runs on the same text
(vocab_only, best of --repeat) and the ids are compared. --pure measures the
pure-Python loops instead of the native ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file's name shadows the standard library's `tokenize` (imported by linecache and
# friends): take its folder off the path and put the repository root on it instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

from pyengine.tokenizer import Tokenizer  # noqa: E402

_WORDS = """the of and to a in is it you that he was for on are with as I his they be at one
have this from or had by hot word but what some we can out other were all there when up use
your how said an each she which do their time if will way about many then them write would
like so these her long make thing see him two has look more day could go come did number
sound no most people my over know water than call first who may down side been now find
any new work part take get place made live where after back little only round man year came
show every good me give our under name very through just form sentence great think say help
low line differ turn cause much mean before move right boy old too same tell does set three
want air well also play small end put home read hand port large spell add even land here
must big high such follow act why ask men change went light kind off need house picture try
us again animal point mother world near build self earth father head stand own page should
country found answer school grow study still learn plant cover food sun four between state
keep eye never last let thought city tree cross farm hard start might story saw far sea draw
left late run while press close night real life few north open seem together next white
children begin got walk example ease paper group always music those both mark often letter
until mile river car feet care second book carry took science eat room friend began idea
fish mountain stop once base hear horse cut sure watch color face wood main enough plain
girl usual young ready above ever red list though feel talk bird soon body dog family direct
pose leave song measure door product black short numeral class wind question happen complete
ship area half rock order fire south problem piece told knew pass since top whole king space
heard best hour better true during hundred five remember step early hold west ground interest
reach fast verb sing listen six table travel less morning ten simple several vowel toward war
lay against pattern slow center love person money serve appear road map rain rule govern pull
cold notice voice unit power town fine certain fly fall lead cry dark machine note wait plan
figure star box noun field rest correct able pound done beauty drive stood contain front teach
week final gave green oh quick develop ocean warm free minute strong special mind behind clear
tail produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead
dry wonder laugh thousand ago ran check game shape equate miss brought heat snow tire bring
yes distant fill east paint language among""".split()
_CJK = ("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下"
        "过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两"
        "体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线"
        "内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并"
        "提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见"
        "計画東京都大阪駅電車時間朝昼夜新聞雑誌書店図書館学校先生学生友達家族仕事会社休日旅行料理食事")
_EMOJI = ["🚀", "😀", "🎉", "👍", "❤️", "🔥", "✅", "🦙", "🇫🇷", "🇯🇵", "👨‍👩‍👧‍👦", "🧑🏽‍💻",
          "😶‍🌫️", "🌍", "⭐", "🤖", "📦", "🐍"]
_CODE_NAMES = ["value", "index", "count", "result", "buffer", "node", "item", "key", "data",
               "config", "tokens", "offset", "length", "parser", "state", "cache", "width"]


def _syllable_word(rng: random.Random) -> str:
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    return "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 4)))


def _prose(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(2, 6)):
        words = []
        for _ in range(rng.randint(5, 18)):
            if rng.random() < 0.04:
                words.append(_syllable_word(rng))  # rare words: cache misses
            else:
                words.append(_WORDS[min(int(rng.paretovariate(0.9)) - 1, len(_WORDS) - 1)])
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        sentence = " ".join(words)
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice(".!?.,;"))
    return " ".join(sentences) + "\n\n"


def _code(rng: random.Random) -> str:
    lines = [f"def {rng.choice(_CODE_NAMES)}_{rng.choice(_CODE_NAMES)}(self, x):"]
    for _ in range(rng.randint(3, 10)):
        indent = " " * (4 * rng.randint(1, 3))
        a, b = rng.choice(_CODE_NAMES), rng.choice(_CODE_NAMES)
        lines.append(rng.choice([
            f"{indent}{a} = self.{b}[{rng.randint(0, 64)}] + x * {rng.random():.3f}",
            f"{indent}if {a} >= {rng.randint(0, 1000)}:  # {rng.choice(_WORDS)} {rng.choice(_WORDS)}",
            f"{indent}return {{'{a}': {b}, \"n\": {rng.randint(0, 9)}}}",
            f"{indent}for {a} in range(len({b})):",
            f"{indent}{a}.append(({b}, {rng.randint(0, 255):#04x}))",
        ]))
    return "\n".join(lines) + "\n\n"


def _cjk(rng: random.Random) -> str:
    parts = ["".join(rng.choice(_CJK) for _ in range(rng.randint(4, 20))) for _ in range(rng.randint(1, 4))]
    return "，".join(parts) + "。\n"


def _emoji(rng: random.Random) -> str:
    return " ".join("".join(rng.choice(_EMOJI) for _ in range(rng.randint(1, 3)))
                    for _ in range(rng.randint(1, 6))) + "\n"


def _whitespace(rng: random.Random) -> str:
    return "".join(rng.choice([" " * rng.randint(2, 40), "\t" * rng.randint(1, 6), "\n" * rng.randint(1, 5),
                               " \n", "\t \t"]) for _ in range(rng.randint(1, 4)))


def mixed_text(size_bytes: int, seed: int = 0) -> str:
    """~size_bytes of UTF-8: prose 55%, code 25%, CJK 12%, emoji 4%, whitespace 4%."""
    rng = random.Random(seed)
    kinds = [_prose, _code, _cjk, _emoji, _whitespace]
    weights = [55, 25, 12, 4, 4]
    budget = {k: size_bytes * w // 100 for k, w in zip(kinds, weights)}
    parts, used = [], dict.fromkeys(kinds, 0)
    while any(used[k] < budget[k] for k in kinds):
        kind = rng.choices(kinds, weights)[0]
        if used[kind] >= budget[kind]:
            continue
        part = kind(rng)
        used[kind] += len(part.encode("utf-8"))
        parts.append(part)
    return "".join(parts)


def _time_encode(encode, text: str, repeat: int) -> tuple[float, list[int]]:
    best, ids = float("inf"), []
    for _ in range(repeat):
        start = time.perf_counter()
        ids = encode(text)
        best = min(best, time.perf_counter() - start)
    return best, ids


def _llama_cpp_encoder(path: Path):
    try:
        import llama_cpp
    except ImportError:
        return None
    model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    return lambda text: model.tokenize(text.encode("utf-8"), add_bos=False, special=False)


def bench(path: Path, text: str, repeat: int) -> dict:
    size_mb = len(text.encode("utf-8")) / 1e6
    start = time.perf_counter()
    tok = Tokenizer.from_gguf(path)
    load_s = time.perf_counter() - start
    cold_s, ids = _time_encode(tok.encode, text, 1)
    warm_s, _ = _time_encode(tok.encode, text, repeat)
    row = {"vocab": path.name, "tokens": len(ids), "load_s": load_s,
           "cold_mbps": size_mb / cold_s, "warm_mbps": size_mb / warm_s}
    llama = _llama_cpp_encoder(path)
    if llama is not None:
        ref_s, ref_ids = _time_encode(llama, text, repeat)
        row["llama_mbps"] = size_mb / ref_s
        row["same_ids"] = list(ref_ids) == ids
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", action="append", help="store model names")
    parser.add_argument("--vocab", action="append", type=Path, help="GGUF paths")
    parser.add_argument("--pure", action="store_true", help="pure-Python loops (no native core)")
    args = parser.parse_args(argv)
    if args.pure:
        os.environ["PYENGINE_PURE_TOKENIZER"] = "1"
    from pyengine.tokenizer import native
    print(f"backend: {'native (pyengine._core)' if native.available() else 'pure Python'}")
    paths = list(args.vocab or [])
    if args.model or not paths:
        from pyengine.store import resolve_model
        paths += [resolve_model(name) for name in (args.model or ["smollm2-135m", "gemma3-270m"])]
    text = mixed_text(int(args.size_mb * 1e6))
    print(f"text: {len(text.encode('utf-8')) / 1e6:.2f} MB, {len(text)} characters")
    header = f"{'vocabulary':40} {'tokens':>8} {'load s':>7} {'cold MB/s':>10} {'warm MB/s':>10}"
    print(header + f" {'llama.cpp MB/s':>15} {'same ids':>9}")
    for path in paths:
        row = bench(path, text, args.repeat)
        line = (f"{row['vocab'][:40]:40} {row['tokens']:8d} {row['load_s']:7.2f} "
                f"{row['cold_mbps']:10.2f} {row['warm_mbps']:10.2f}")
        if "llama_mbps" in row:
            line += f" {row['llama_mbps']:15.2f} {str(row['same_ids']):>9}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
