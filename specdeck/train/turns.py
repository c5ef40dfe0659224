"""Requests beyond one-turn instructions: a second turn on the target's own answer, a translation,
an extraction into a given form, a question answered from passages.

A head drafts best on text like the text it learnt from. The composed instructions
(`specdeck.train.corpus`) each ask once, in English, for what the target knows; people also ask a
second time about an answer (shorter, as a list, in French), ask for translations, and paste text
to extract from or answer from. These requests are composed from the same licensed sources
(`specdeck.train.texts`), never from a benchmark's prompts; a second turn follows the target's own
first answer, through the target's own chat template (`second_turn_suffix`).
"""

from __future__ import annotations

import random
import re

from specdeck.train.texts import Exchange

FOLLOW_UPS = [
    "Make your answer shorter, keeping its main points.",
    "Rewrite your answer as a bulleted list.",
    "Explain the first point of your answer in more detail.",
    "Give a concrete example for your answer.",
    "Explain your answer to a ten-year-old.",
    "Rewrite your answer in a formal tone.",
    "Translate your answer into French.",
    "Translate your answer into German.",
    "Translate your answer into Spanish.",
    "Summarize your answer in one sentence.",
    "What is the most important point of your answer, and why?",
    "Turn your answer into a short email to a colleague.",
    "Add a title and a short conclusion to your answer.",
    "Check your answer for mistakes and give a corrected version.",
    "Now argue for the opposite view.",
    "Write three questions a reader might ask about your answer, and answer them.",
    "Continue your answer with one more paragraph.",
    "Rewrite your answer without using the word 'the'.",
]
LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch")
TRANSLATE = [
    "Translate into {lang}: {s}",
    "Translate the following text into {lang}.\n\n{s}",
    'How would you say this in {lang}? "{s}"',
    "Please translate this sentence to {lang} and explain any difficult word: {s}",
]
EXTRACT = [
    "Extract every function, class and module named in the text below, as a JSON list.\n\n{p}",
    "From the text below, make a table of the options or parameters it mentions and what each does.\n\n{p}",
    "List each value or number in the text below with what it refers to.\n\n{p}",
    "Give the text below a title, then three keywords, then a one-sentence summary.\n\n{p}",
]
ANSWER_FROM = [
    "Answer the question using only the passages below.\n\nQuestion: {q}\n\n{passages}",
    "{passages}\n\nUsing the entries above, answer: {q}",
    "Here are some dictionary entries:\n\n{passages}\n\n{q} Quote the entry you use.",
]
QUESTIONS = [
    'What does "{w}" mean?',
    'Which entry explains "{w}", and how would you use the word in a sentence?',
    'What is the difference between "{w}" and "{v}"?',
]
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def sentences(exchanges: list[Exchange]) -> list[str]:
    """Plain sentences of the documentation's prose and of WordNet's examples, 40 to 240 characters,
    without markup or code."""
    found = []
    for e in exchanges:
        if e.source == "wordnet":
            candidates = re.findall(r'Example: "(.+?)"', e.answer)
        elif e.source == "python-docs":
            candidates = _SENTENCE.split(re.sub(r"\s+", " ", e.answer))
        else:
            continue
        for s in candidates:
            s = s.strip()
            if 40 <= len(s) <= 240 and not re.search(r"[`*_=<>{}\[\]|#\\]|\.\.|::|\(\)|^\d", s):
                found.append(s)
    return found


def one_turn_requests(exchanges: list[Exchange], seed: int = 0, limit: int = 6000) -> list[str]:
    """Translations, extractions and questions answered from dictionary entries, a third of `limit`
    each (fewer where the sources are smaller)."""
    rng = random.Random(seed + 17)
    each = limit // 3
    pool = sentences(exchanges)
    rng.shuffle(pool)
    asked = [rng.choice(TRANSLATE).format(lang=rng.choice(LANGUAGES), s=s) for s in pool[:each]]
    passages = [e.answer for e in exchanges if e.source == "python-docs" and 300 < len(e.answer)]
    rng.shuffle(passages)
    asked += [rng.choice(EXTRACT).format(p=p[:1400]) for p in passages[:each]]
    entries = [line for e in exchanges if e.source == "wordnet" for line in e.answer.splitlines()]
    for _ in range(min(each, len(entries) // 4)):
        chosen = rng.sample(entries, 4)
        words = [re.sub(r"^\d+\. \*\*(.+?)\*\*.*", r"\1", line) for line in chosen]
        question = rng.choice(QUESTIONS).format(w=words[0], v=words[1])
        rng.shuffle(chosen)
        text = "\n".join(re.sub(r"^\d+\. ", "", line) for line in chosen)
        asked.append(rng.choice(ANSWER_FROM).format(q=question, passages=text))
    rng.shuffle(asked)
    return asked


def second_turn_suffix(tokenizer, follow_up: str, eos_id: int) -> list[int] | None:
    """The ids that follow a first answer ending in `eos_id` to ask `follow_up` and open the reply,
    as the tokenizer's chat template writes a third message; None where the template does not end
    an assistant turn with that token (its second turns are then not made)."""
    first = [{"role": "user", "content": "X"}, {"role": "assistant", "content": "Y"}]
    try:
        one = tokenizer.apply_chat_template(first, tokenize=False)
        two = tokenizer.apply_chat_template(
            [*first, {"role": "user", "content": follow_up}], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template without a chat, or one that refuses this order of roles
        return None
    end, eos = one.rfind("Y") + 1, tokenizer.decode([eos_id])
    if end == 0 or not two.startswith(one) or not one[end:].startswith(eos):
        return None
    return tokenizer(one[end + len(eos) :] + two[len(one) :], add_special_tokens=False)["input_ids"]


__all__ = ["FOLLOW_UPS", "one_turn_requests", "second_turn_suffix", "sentences"]
