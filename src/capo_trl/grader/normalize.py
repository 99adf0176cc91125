"""Text normalisation for grading: pure string work with linear regexes, safe to run anywhere.

Rewrites the notations math-verify misreads (scientific notation, unbraced ``\\frac12``, Unicode math),
finds boxed answers, and turns a bare dataset answer into the gold LaTeX math-verify parses.
"""

from __future__ import annotations

import re
import unicodedata

# ``4.5e33`` -> ``4.5\times10^{33}``: math-verify reads ``e`` as Euler's number (docs/reward.md).
# Only where no other reading is plausible: ``2e+1`` and ``4e-3`` may be 2e+1 and 4e-3 (Euler).
_SCI = re.compile(r"(?<![\w.\\])([0-9]+)(\.[0-9]+)?([eE])([+-]?)([0-9]{1,4})(?![\w.])")
# Digit groups: ``1 000``, ``1\,251``, ``2~000`` (what NFKC makes of no-break and thin spaces too).
# latex2sympy reads ``2 000`` as 2*000 = 0 and ``1\,251`` or ``1\;251`` as 252. A run that a decimal point
# precedes, or another group precedes or follows (``3.141 592``, ``10 100 1000``), is left alone.
_SEP = r"(?: |~|\\[,;: ]|\\thinspace ?)"
_THOUSANDS = re.compile(
    r"(?<![0-9.])(?<![0-9][ ~])(?<![0-9]\\[,;: ])(?<![0-9]\\thinspace)(?<![0-9]\\thinspace )"
    rf"[0-9]{{1,3}}(?:{_SEP}[0-9]{{3}})+(?![0-9])(?!{_SEP}[0-9])"
)
_SEP_RE = re.compile(_SEP)
# Cheap first checks (a pattern that starts with a digit is scanned fast; one that starts with a
# lookbehind is tried at every position): the rewrites run only where one of these matches.
_MAYBE_GROUPS = re.compile(rf"[0-9]{_SEP}[0-9]{{3}}")
_MAYBE_TRAIL = re.compile(r"[0-9]\.(?:[0-9]*0(?![0-9])|\s*(?:\}|\$|\\\]|\\\)|$))")
_MAYBE_SCI = re.compile(r"[0-9][eE][+-]?[0-9]")
# ``1.50`` -> ``1.5``, ``2.0`` -> ``2`` (math-verify builds Floats of different precision for equal
# decimals of 16+ digits); not before ``\overline``, ``{``, ``.`` or another digit.
_TRAIL_ZEROS = re.compile(r"(?<![0-9.])([0-9]+)\.([0-9]*?)0+(?![0-9.\\{])")
# ``15.`` at the end of a box or formula -> ``15`` (latex2sympy keeps ``15.`` only as text).
_TRAIL_DOT = re.compile(r"(?<![0-9.])([0-9]+)\.(?=\s*(?:\}|\$|\\\]|\\\)|$))")
# ``\frac12``, ``\frac1{2}``, ``\sqrt3``: valid TeX that latex2sympy cannot parse unbraced.
_BARE_ARG = re.compile(r"\\(dfrac|tfrac|frac|sqrt)(?:\s*([0-9])|\s+([A-Za-z]))")
_BAL = r"\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\}"  # balanced braces, 3 levels deep, no backtracking
_BARE_ARG2 = re.compile(r"(\\[dt]?frac\s*" + _BAL + r")\s*([0-9]|[A-Za-z](?![A-Za-z]))")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_JOIN = re.compile(r"[\s$,;.]*(?:(?:and|or|,)[\s$]*)?")  # text between boxes of one answer
_DOLLAR = re.compile(r"(?<!\\)\$")
_TEXT_OPEN = re.compile(r"\\(?:text|mathrm)\s*\{")
_CANON_DROP = re.compile(r"\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[,;:!]|(?<!\\)\$")
_CANON_SPACE = re.compile(r"\s+(?![^\W_])|(?<![^\W_])\s+")  # kept only between two letters/digits
_WORD_OR_CMD = re.compile(r"\\[A-Za-z]+|[^\W\d_]+")
_DELIMS = ((r"\[", r"\]"), (r"\(", r"\)"), ("$$", "$$"), ("$", "$"))


# Unicode math -> LaTeX. Each step is one regex pass, ``str.translate`` or NFKC: linear time.
_SUP = "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ"
_SUB = "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼ"
_SUP_RUN = re.compile(f"[{_SUP}]+")
_SUB_RUN = re.compile(f"[{_SUB}]+")
_SUP_ASCII = str.maketrans(_SUP, "0123456789+-=()ni")
_SUB_ASCII = str.maketrans(_SUB, "0123456789+-=()aeoxhklmnpstij")
_VULGAR = re.compile("[\u00bc-\u00be\u2150-\u215e\u2189]")  # ¼ ½ ¾ ⅐ ... ⅞ ↉ (not ⅟: no denominator)
_SLASH_FRAC = re.compile(r"([0-9]+)\s*[\u2044\u2215]\s*([0-9]+)")  # 1⁄2 (what NFKC makes of ½), 1∕2
# ``²⁄₃``: the Unicode way to write any fraction; not after a letter or a bracket (an exponent there).
_SUPSUB_FRAC = re.compile(r"(?<![^\W\d_])(?<![)}\]|])([⁰¹²³⁴⁵⁶⁷⁸⁹]+)[\u2044\u2215/]([₀₁₂₃₄₅₆₇₈₉]+)")
_ROOT_TOKEN = re.compile(r"[√∛∜][ \t]*\(?|[()]")
_ROOT_ARG = re.compile(
    r"[0-9]+(?:\.[0-9]+)?|[^\W\d_]|\\[dt]?frac\s*(?:" + _BAL + r"|[0-9A-Za-z])\s*(?:" + _BAL + r"|[0-9A-Za-z])"
    r"|\\[A-Za-z]+(?![A-Za-z{\[])"
)
# Non-ASCII decimal digits (``٥``, ``५``; NFKC keeps them): their ASCII digit.
_OTHER_DIGIT = re.compile(r"(?![0-9])\d")
# Hyphen, figure dash, en dash as a minus sign, only where no operand precedes (``–3``, ``(–1, 2)``):
# ``1–3`` and ``2 – 3`` may be ranges and stay as they are (math-verify then reads nothing).
_DASH = re.compile("[\u2010-\u2013]")
# ℝ ℤ ... before NFKC, which makes plain letters of them.
_BLACKBOARD = str.maketrans({c: f"\\mathbb{{{n}}}" for c, n in zip("ℝℤℕℂℚℍℙ", "RZNCQHP")})
_ROOT_CMD = {"√": r"\sqrt", "∛": r"\sqrt[3]", "∜": r"\sqrt[4]"}
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character, or a brace
_GREEK = "αβγδεζηθικλμνξπρστυφχψωΓΔΘΛΞΠΣΦΨΩ"
_GREEK_NAMES = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
    "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega",
    "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Phi", "Psi", "Omega",
]  # fmt: skip
_SYMBOLS = str.maketrans(
    {
        "×": r"\times ", "÷": r"\div ", "·": r"\cdot ", "⋅": r"\cdot ", "∙": r"\cdot ", "−": "-",
        "∞": r"\infty ", "≤": r"\le ", "≥": r"\ge ", "⩽": r"\le ", "⩾": r"\ge ", "≠": r"\ne ",
        "±": r"\pm ", "∓": r"\mp ", "°": r"^{\circ}", "∈": r"\in ", "∉": r"\notin ", "∪": r"\cup ",
        "∩": r"\cap ", "≈": r"\approx ", "∅": r"\emptyset ", "∠": r"\angle ", "⁄": "/", "∕": "/",
        "\u200b": "", "\u200c": "", "\u200d": "", "\u2060": "", "\ufeff": "",
        **{g: f"\\{name} " for g, name in zip(_GREEK, _GREEK_NAMES)},
    }
)  # fmt: skip


def _vulgar(m: re.Match) -> str:
    num, den = unicodedata.normalize("NFKC", m.group()).split("\u2044")
    return f"\\frac{{{num}}}{{{den}}}"  # after a digit: 1\frac{1}{2} is a mixed number to math-verify


def _dash(text: str, i: int) -> str:
    """``-`` for the dash at ``text[i]`` when no operand precedes it (spaces skipped), else the dash."""
    j = i - 1
    while j >= 0 and text[j].isspace():
        j -= 1  # linear overall: the scan stops at the previous non-space, at worst the previous dash
    return text[i] if j >= 0 and (text[j].isalnum() or text[j] in ")}]|!") else "-"


def _supsub_frac(m: re.Match) -> str:
    return f"\\frac{{{m.group(1).translate(_SUP_ASCII)}}}{{{m.group(2).translate(_SUB_ASCII)}}}"


def _roots(text: str) -> str:
    """``√2`` -> ``\\sqrt{2}``, ``√(x+1)`` -> ``\\sqrt{x+1}`` (nested too), ``∛8`` -> ``\\sqrt[3]{8}``.

    One pass over the root signs and parentheses; a stack remembers which ``(`` opened a root.
    """
    out, stack, pos = [], [], 0
    for m in _ROOT_TOKEN.finditer(text):
        out.append(text[pos : m.start()])
        pos, tok = m.end(), m.group()
        if tok == "(":
            stack.append(-1)
            out.append(tok)
        elif tok == ")":
            out.append("}" if stack and stack.pop() >= 0 else ")")
        else:
            cmd = _ROOT_CMD[tok[0]]
            if tok.endswith("("):
                stack.append(len(out))
                out.append(cmd + "{")
            elif arg := _ROOT_ARG.match(text, pos):
                out.append(f"{cmd}{{{arg.group()}}}")
                pos = arg.end()
            else:  # ``√{...}`` already braced, or something we leave to math-verify
                out.append(cmd)
    out.append(text[pos:])
    for k in stack:  # a root whose ``(`` never closes: keep the parenthesis
        if k >= 0:
            out[k] = out[k][:-1] + "("
    return "".join(out)


def _unicode_math(text: str) -> str:
    """Unicode math notation -> the LaTeX math-verify reads (``½``, ``√2``, ``２``, ``x²``, ``×``...).

    A no-op for pure ASCII (checked in O(1)). Order matters: superscripts and vulgar fractions go
    before NFKC, which would flatten ``x²`` to ``x2`` and ``1½`` to ``11⁄2``.
    """
    if text.isascii():
        return text
    if "\u2044" in text or "\u2215" in text or "/" in text:
        text = _SUPSUB_FRAC.sub(_supsub_frac, text)
    if _SUP_RUN.search(text):
        text = _SUP_RUN.sub(lambda m: "^{" + m.group().translate(_SUP_ASCII) + "}", text)
    if _SUB_RUN.search(text):
        text = _SUB_RUN.sub(lambda m: "_{" + m.group().translate(_SUB_ASCII) + "}", text)
    text = _VULGAR.sub(_vulgar, text)
    text = text.translate(_BLACKBOARD)
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)  # full-width ２ ＋ ／ ｘ, no-break spaces, ...
    if _OTHER_DIGIT.search(text):
        text = _OTHER_DIGIT.sub(lambda m: str(unicodedata.decimal(m.group())), text)
    if _DASH.search(text):
        text = _DASH.sub(lambda m: _dash(text, m.start()), text)
    if "\u2044" in text or "\u2215" in text:
        text = _SLASH_FRAC.sub(r"\\frac{\1}{\2}", text)
    if "√" in text or "∛" in text or "∜" in text:
        text = _roots(text)
    return text.translate(_SYMBOLS)


def _balanced(text: str) -> bool:
    """Whether the unescaped braces of ``text`` balance (``\\frac{1}{`` does not)."""
    depth = 0
    for m in _BRACE.finditer(text):
        c = m.group()
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0



def _trim_zeros(m: re.Match) -> str:
    return f"{m.group(1)}.{m.group(2)}" if m.group(2) else m.group(1)


def _scientific(m: re.Match) -> str:
    """``4.5e33`` -> ``4.5\\times10^{33}``, unless Euler's e is as plausible (``2e+1``, ``4e-3``)."""
    whole, frac, e, sign, exp = m.groups()
    if e == "e" and sign and not frac and whole != "1":
        return m.group()  # math-verify reads it with Euler's e, as a mathematician would
    return f"{whole}{frac or ''}\\times10^{{{int(sign + exp)}}}"


def _normalize(text: str) -> str:
    """Rewrite notations math-verify misreads; a no-op for everything else."""
    text = _unicode_math(text)
    if _MAYBE_GROUPS.search(text):
        text = _THOUSANDS.sub(lambda m: _SEP_RE.sub("", m.group()), text)
    if _MAYBE_TRAIL.search(text):
        text = _TRAIL_DOT.sub(r"\1", _TRAIL_ZEROS.sub(_trim_zeros, text))
    if _MAYBE_SCI.search(text):
        text = _SCI.sub(_scientific, text)
    if "\\" in text:
        text = _BARE_ARG.sub(lambda m: f"\\{m.group(1)}{{{m.group(2) or m.group(3)}}}", text)
        text = _BARE_ARG2.sub(lambda m: f"{m.group(1)}{{{m.group(2)}}}", text)
    return text


def _box_spans(text: str) -> list[tuple[int, int]]:
    """(start of ``\\boxed``, index of its closing brace) for each outermost balanced box."""
    spans: list[tuple[int, int]] = []
    for m in _BOX.finditer(text):
        if spans and m.start() < spans[-1][1]:
            continue  # nested in the previous box
        depth = 1
        for i in range(m.end(), len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    spans.append((m.start(), i))
                    break
    return spans


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox``) with balanced braces, else None."""
    spans = _box_spans(text) if "\\" in text else []
    if not spans:
        return None
    start, end = spans[-1]
    return text[_BOX.match(text, start).end() : end]


def _final_run(text: str, spans: list[tuple[int, int]]) -> int:
    """Index in ``spans`` of the first box of the last run of boxes joined only by ``and``, commas or math."""
    first = len(spans) - 1
    while first > 0 and _JOIN.fullmatch(text, spans[first - 1][1] + 1, spans[first][0]):
        first -= 1
    return first


def _final_boxes(text: str) -> str:
    """Keep the last run of boxes: ``\\boxed{7} ... wait ... \\boxed{8}`` answers 8, while
    ``$\\boxed{2}$ and $\\boxed{3}$`` still answers {2, 3} (math-verify would join all boxes)."""
    if text.count("\\boxed") + text.count("\\fbox") < 2:
        return text
    spans = _box_spans(text)
    if len(spans) < 2:
        return text
    first = _final_run(text, spans)
    if first < len(spans) - 1:  # several boxes, one answer: a form math-verify reads as a set
        return ", ".join(text[a : b + 1] for a, b in spans[first:])
    return text[spans[-1][0] :]


# A completion that is nothing but a number (``54``, ``-3.5``, ``54.``): its answer, though unanchored.
_BARE_NUMBER = re.compile(r"\s*(-?[0-9]+(?:\.[0-9]+)?)\.?\s*")


def answer_span(text: str) -> tuple[int, int] | None:
    """``(start, end)`` characters of the final answer the grader reads, found without a worker: the contents
    of the last run of boxes (from the first box's content to the last one's), or a completion that is only a
    number; None otherwise (then :meth:`MathGrader.answer_spans` asks math-verify's extraction)."""
    if bare := _BARE_NUMBER.fullmatch(text):
        return bare.span(1)
    spans = _box_spans(text) if "\\" in text else []
    if not spans:
        return None
    start, end = _BOX.match(text, spans[_final_run(text, spans)][0]).end(), spans[-1][1]
    inner = text[start:end]
    if not inner.strip():
        return None
    return start + len(inner) - len(inner.lstrip()), end - len(inner) + len(inner.rstrip())


def prepared_text(text: str) -> str:
    """What math-verify is given for a completion: its final answer run, notations rewritten.

    A completion that is only a number is read as that number (boxed): nothing else in it could be
    the answer. Any other unanchored number still counts for nothing (``9 * 6 = 54``, ``I think 54``).
    """
    if bare := _BARE_NUMBER.fullmatch(text):
        text = f"\\boxed{{{bare[1]}}}"
    return _normalize(_final_boxes(text))


def _gold_latex(gold: str) -> str:
    """Bare dataset answer -> ``\\boxed{...}``: parsed raw, ``2\\sqrt{3}`` reads as 2 (trap 1)."""
    g = _unicode_math(gold.strip())  # first: full-width ``＄`` or ``＼boxed`` become ASCII
    boxed = last_boxed(g) if "\\" in g else None
    if boxed is not None:
        g = boxed
    else:
        for left, right in _DELIMS:
            if len(g) > len(left) + len(right) and g.startswith(left) and g.endswith(right):
                g = g[len(left) : -len(right)].strip()
                break
    # Scraped answers such as ``8$,$4`` or ``(0, 1)$.``: stray math delimiters and a final stop.
    g = _DOLLAR.sub("", g).strip().rstrip(".").strip()
    return "\\boxed{" + _normalize(g) + "}"


def _canon(s: str) -> str:
    """String form for answers math-verify keeps only as text (``E_{1},E_{2}`` == ``E_1, E_2``).

    Only rewrites that keep the TeX the same: spacing, ``\\left``/``\\right`` and ``$`` dropped,
    ``\\text{...}`` unwrapped, braces around one character dropped (``\\frac{1}{12}`` stays apart
    from ``\\frac{11}{2}``), letters lower-cased (command names kept).
    """
    s = _CANON_SPACE.sub("", _CANON_DROP.sub("", s))
    s = re.sub(r"\s+", " ", s)
    out: list[str] = []  # tokens: one character, or a backslash and the character after it
    stack: list[int | None] = []  # per open brace: its index in ``out``, None for ``\\text{``
    i, n = 0, len(s)
    while i < n:
        if s[i] == "\\":
            if m := _TEXT_OPEN.match(s, i):
                stack.append(None)
                i = m.end()
                continue
            out.append(s[i : i + 2])
            i += 2
            continue
        c = s[i]
        i += 1
        if c == "{":
            stack.append(len(out))
            out.append(c)
        elif c == "}" and stack:
            k = stack.pop()
            if k is not None and len(out) == k + 2 and len(out[k + 1]) == 1:
                out[k] = out.pop()  # {1} -> 1
            elif k is not None:
                out.append(c)
        else:
            out.append(c)
    s = "".join(out).strip()
    return _WORD_OR_CMD.sub(lambda m: m.group() if m.group()[0] == "\\" else m.group().lower(), s)


def as_text(completion) -> str:
    """String completion or chat messages (last assistant turn; content may be a list of parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)) and completion:
        msgs = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in msgs if m.get("role", "assistant") == "assistant"] or msgs
        content = assistant[-1].get("content", "") if assistant else ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content if isinstance(content, str) else ""
    return "" if completion is None else str(completion)


def _gold_key(gold) -> tuple[str, ...]:
    """One gold cell -> tuple of acceptable answers (a list means any of them counts)."""
    items = gold if isinstance(gold, (list, tuple)) else [gold]
    return tuple(str(g) for g in items if g is not None and str(g).strip())


