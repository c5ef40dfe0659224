"""Requests composed from WordNet's everyday nouns: the wide part of the requests whose answers a
feature head learns from.

The instructions in `specdeck.train.corpus` cross a couple of hundred topics with a few dozen tasks.
A head trained on the target's answers to them agrees with the target on more of the same far more
than on requests of other kinds, so its drafts pass less often where people ask other things. Here
a request draws its subject from the nouns that WordNet's sense-tagged corpus counts at least once
as their word's first sense (`cntlist.rev`): about ten thousand, grouped by WordNet's own kinds
(people, artifacts, foods, acts, feelings, places...). Its task comes from lists written here per
kind of chat use: writing in many forms and for many readers, explaining, comparing two kinds of
the same thing (WordNet co-hyponyms), role play, advice, brainstorming, word problems of several
steps, logic puzzles, code in several languages, and rewriting or translating WordNet's example
sentences. Technical questions draw their terms from the nouns WordNet files under a science or
engineering (its topic domains: physics, statistics, genetics, computer science...), everyday or
not. No benchmark text is read; a machine without WordNet composes none.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specdeck.train.texts import WORDNET, wordnet_synsets
from specdeck.train.turns import LANGUAGES

# WordNet's lexicographer files (data.noun's second field) by the kind of request they suit
GROUPS = {
    "thing": (5, 6, 8, 13, 17, 20, 27),  # animals, artifacts, body, food, objects, plants, substances
    "idea": (7, 9, 10, 12, 19, 22, 24, 26),  # attributes, cognition, communication, feelings, phenomena, ...
    "activity": (4, 11),  # acts, events
    "place": (15,),
    "person": (18,),
    "group": (14, 21, 28),  # groups, possessions, times
}
# the disciplines whose topic domains give technical terms: these and the fields below them
DISCIPLINES = ("science", "engineering")
COGNITION = 9  # the lexicographer file the disciplines are in (not "engineering" the act)


@dataclass
class Lexicon:
    """Everyday nouns by group, pairs of kinds of one thing, technical terms and example sentences."""

    nouns: dict[str, list[str]] = field(default_factory=dict)
    pairs: list[tuple[str, str, str]] = field(default_factory=list)  # (kind a, kind b, what both are)
    terms: list[tuple[str, str]] = field(default_factory=list)  # (term, its field: "physics"...)
    sentences: list[str] = field(default_factory=list)

    def pick(self, rng: random.Random, *groups: str) -> str:
        return rng.choice(self.nouns[rng.choice(groups)])


def read_lexicon(folder: Path | None = None) -> Lexicon | None:
    """The lexicon from WordNet's files in `folder` (Debian's wordnet-base), or None where they are missing."""
    folder = folder or WORDNET
    if not (folder / "data.noun").exists() or not (folder / "cntlist.rev").exists():
        return None
    first_senses = set()
    for line in (folder / "cntlist.rev").read_text(encoding="utf-8", errors="replace").splitlines():
        key, number, _count = line.split()
        if number == "1":
            first_senses.add(key)
    group_of = {lex: name for name, files in GROUPS.items() for lex in files}
    lexicon = Lexicon(nouns=defaultdict(list))
    name_of: dict[str, str] = {}
    kinds: dict[str, list[str]] = defaultdict(list)
    first_lemma: dict[str, str] = {}
    broader: dict[str, list[str]] = {}  # each noun synset's hypernyms, instances' classes too
    in_domain: list[tuple[str, str]] = []  # (term, its topic domain's synset)
    disciplines = set()
    for part, words, gloss in wordnet_synsets(folder):
        lexicon.sentences += [s.strip().strip('"') for s in gloss.split(";") if s.strip().startswith('"')]
        lex, count = int(words[1]), int(words[3], 16)
        if part != "noun":
            continue
        pointers = words[4 + 2 * count :]  # their count, then (symbol, offset, part, source/target) each
        linked = [(pointers[1 + 4 * i], pointers[2 + 4 * i]) for i in range(int(pointers[0]))]
        first_lemma[words[0]] = words[4]
        broader[words[0]] = [offset for symbol, offset in linked if symbol in ("@", "@i")]
        in_domain += [(words[4].replace("_", " "), offset) for symbol, offset in linked if symbol == ";c"]
        if lex == COGNITION and words[4] in DISCIPLINES:
            disciplines.add(words[0])
        if lex not in group_of:
            continue
        parents = [offset for symbol, offset in linked if symbol == "@"]
        for i in range(count):
            lemma = words[4 + 2 * i]
            if f"{lemma.lower()}%1:{lex:02d}:{int(words[5 + 2 * i], 16):02d}::" in first_senses:
                noun = lemma.replace("_", " ")
                lexicon.nouns[group_of[lex]].append(noun)
                name_of[words[0]] = noun
                for parent in parents:
                    kinds[parent].append(noun)
                break
    for parent, children in kinds.items():
        if parent in name_of and len(children) > 1:
            lexicon.pairs += [(a, b, name_of[parent]) for a, b in zip(children, children[1:])]
    fields = {domain for _, domain in in_domain if _within(domain, disciplines, broader)}
    lexicon.terms = [(term, first_lemma[domain].replace("_", " ")) for term, domain in in_domain if domain in fields]
    # sentences a request can quote as they are: whole ones of a few words to a few dozen
    lexicon.sentences = [s for s in lexicon.sentences if 4 <= len(s.split()) <= 30 and '"' not in s]
    return lexicon


def _within(synset: str, roots: set[str], broader: dict[str, list[str]]) -> bool:
    """Whether `synset` is one of `roots` or below one of them (through hypernyms)."""
    seen, todo = set(), [synset]
    while todo:
        current = todo.pop()
        if current in roots:
            return True
        if current not in seen:
            seen.add(current)
            todo += broader.get(current, [])
    return False


# fmt: off
# the word lists requests are composed from, several to a line
FORMS = [
    "a short story", "a poem", "a haiku", "a limerick", "a blog post", "a product description",
    "an advertisement", "a short speech", "a letter", "an email", "a review", "a diary entry",
    "a news report", "a social media post", "a dialogue between two friends", "song lyrics",
    "a fable with a moral", "a persuasive essay", "a travel guide entry", "a museum label",
    "a riddle and its answer", "a motivational message", "an encyclopedia entry", "a short play scene",
]
READERS = [
    "", "", "", " for children", " for a beginner", " for an expert", " for busy professionals",
    " for a school newsletter", " for a local newspaper", " for teenagers",
]
CONSTRAINTS = [
    "", "", "", " Keep it under 100 words.", " Use a humorous tone.", " Use a formal tone.",
    " Write it in three paragraphs.", " Include a surprising twist.", " End with a question.",
    " Use simple words.", " Make it rhyme.", " Use exactly five sentences.",
]
WRITE = ["Write {form} about {x}.{c}", "Compose {form}{r} about {x}.{c}", "Can you write {form}{r} on {x}?{c}"]
EXPLAIN = [
    "What is {x}?", "Explain {x}{r}.", "Why does {x} matter?", "Describe {x} in detail.",
    "What are the main kinds of {x}?", "How has {x} changed over time?", "What are common myths about {x}?",
    "Tell me three surprising facts about {x}.", "What should a beginner know about {x}?",
    "How would you explain {x} to someone who has never heard of it?", "What is the role of {x} in everyday life?",
]
COMPARE = [
    "What is the difference between {a} and {b}?", "Compare {a} and {b}: how are they alike and how do they differ?",
    "Both {a} and {b} are kinds of {k}. Explain what sets each apart.", "Which would you choose, {a} or {b}, and why?",
    "Make a table comparing {a} and {b}.",
]
ROLE = [
    "You are {p}. Describe a typical day at work.", "Pretend you are {p} and give advice to someone starting out.",
    "Act as {p} and answer this: what is the hardest part of your job?",
    "Imagine you are {p} talking about {x}. What would you say?",
    "Role-play as {p} welcoming a new visitor. Stay in character.",
    "As {p}, write a short letter to your younger self.",
]
ADVICE = [
    "How do I get better at {x}?", "Give me a step-by-step plan to learn about {x}.",
    "What mistakes do people make with {x}, and how can I avoid them?", "I am nervous about {x}. Any tips?",
    "Plan a weekend around {x} for a family of four.", "What questions should I ask before {x}?",
]
BRAINSTORM = [
    "Give me ten creative ideas involving {x}.", "Suggest five names for a business about {x}.",
    "List pros and cons of {x}.", "Brainstorm ways a school could teach about {x}.",
    "Write five interview questions for an expert on {x}.", "Invent a new holiday celebrating {x} and describe it.",
]
REWRITE = [
    "Rewrite this sentence in a more formal style: {s}", "Paraphrase this in three different ways: {s}",
    "Fix any grammar or spelling problems and explain the changes: {s}", "Turn this into a question: {s}",
    "Continue this into a short paragraph: {s}", "Explain what this sentence means: {s}",
    "Identify the nouns and verbs in this sentence: {s}", "Make this sentence more vivid: {s}",
]
SCIENCE = [
    "In {f}, what is {x}?", "Explain {x}{r}, as a {f} teacher would.",
    "What role does {x} play in {f}? Give an example.",
    "Write an exam question on {x} in {f}, then answer it step by step.",
    "Tell the history of {x} in {f} briefly.", "What should a student of {f} know about {x}? Answer in five bullet points.",
    "What is a common misconception about {x} in {f}, and what is true instead?",
    "How is {x} used in practice? Explain it to someone starting to study {f}.",
]
TRANSLATE = ["Translate into {lang}: {s}", 'How do you say "{s}" in {lang}?', "Translate this to {lang} and explain the grammar: {s}"]
MORE_LANGUAGES = LANGUAGES + ("Chinese", "Japanese", "Russian", "Korean", "Arabic", "Hindi")
CODE_LANGUAGES = ["Python", "Python", "Python", "JavaScript", "Java", "C", "C++", "Go", "Rust", "TypeScript", "Bash", "SQL"]
CODE_TASKS = [
    "reads a CSV file and prints the average of one column", "merges overlapping intervals",
    "checks whether brackets in a string are balanced", "implements a least-recently-used cache",
    "returns the k most frequent words in a text", "validates a date in the form YYYY-MM-DD",
    "finds the shortest path in a grid with obstacles", "groups a list of words into anagrams",
    "converts a Roman numeral to an integer", "rotates a matrix by 90 degrees",
    "computes the running median of a stream of numbers", "removes comments from source code",
    "counts the islands in a grid of 0s and 1s", "parses a URL into its parts", "implements a queue with two stacks",
    "computes compound interest year by year", "checks whether a string is a valid IPv4 address",
    "finds all pairs in a list that sum to a target", "serialises a binary tree to a string and back",
    "computes the edit distance between two strings", "rate-limits calls to a function",
    "retries a network request with exponential backoff", "splits a list into chunks of a given size",
    "finds the longest common prefix of a list of strings", "schedules tasks by priority with a heap",
    "formats a number of seconds as hours, minutes and seconds", "detects a cycle in a linked list",
    "generates all subsets of a set", "encodes and decodes a string with run-length encoding",
    "tracks an inventory of {t} with add, remove and report operations",
]
CODE = [
    "Write a {lang} function that {task}.", "In {lang}, how would I write code that {task}? Explain each step.",
    "Write a {lang} program that {task}, with comments.", "Write tests for a function that {task}.",
    "What is a good algorithm for code that {task}? Give its time complexity and a {lang} version.",
]
NAMES = [
    "Amir", "Beatriz", "Chen", "Dmitri", "Elena", "Farah", "Gustavo", "Hana", "Ivan", "Jamal", "Keiko", "Liam",
    "Maya", "Nikos", "Olga", "Priya", "Quentin", "Rosa", "Samuel", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe",
]
ITEMS = ["apples", "notebooks", "tickets", "cupcakes", "pencils", "bottles of water", "stamps", "marbles", "books", "plants"]
WORD_PROBLEMS = [
    "{n1} buys {a} {i} at ${p} each and pays with a ${big} bill. How much change does {n1} get? Show each step.",
    "{n1} reads {a} pages a day for {b} days, then {c} pages a day for {d} days. How many pages in all?",
    "A tank holds {big} liters. It leaks {a} liters an hour while a pump adds {b} liters an hour. "
    "After {d} hours, how much water is in it?",
    "{n1} has {big} {i}. {n1} gives a {frac} of them to {n2} and then buys {a} more. How many now?",
    "{n1} is {a} years older than {n2}. In {b} years their ages will add up to {big}. How old is each now?",
    "A recipe needs {a} cups of flour for {b} people. How much flour for {c} people? Explain.",
    "A shop cuts the price of a ${big} coat by {pct}% and then adds {b}% tax. What is the final price?",
    "{n1} walks at {a} km/h and {n2} cycles at {c} km/h from the same place. How far apart are they after {d} hours?",
]
PUZZLES = [
    "{n1} is taller than {n2}, {n3} is shorter than {n2}, and {n4} is taller than {n1}. Who is the shortest? Explain.",
    "{n1}, {n2} and {n3} each own one of a {x}, a {y} and a {z}. {n1} does not own the {x}; {n3} owns the {y}. "
    "Who owns what? Explain your reasoning.",
    "If every {x} is a {k} and no {k} can fly, can a {x} fly? Explain.",
    "{n1} arrives before {n2} but after {n3}. {n4} arrives last. In what order did they arrive?",
    "A box holds {a} red and {b} blue marbles. If you draw two without looking, what is the chance both are red?",
    "Is this argument valid? 'Some {x} are {y}, and all {y} are useful, so some {x} are useful.' Explain.",
]
# fmt: on


def _a(noun: str) -> str:
    return ("an " if noun[0].lower() in "aeiou" else "a ") + noun


def _sentence(lex: Lexicon, rng: random.Random) -> str:
    """An example sentence as a sentence: capitalised, with its full stop."""
    s = rng.choice(lex.sentences)
    return s[0].upper() + s[1:] + ("" if s[-1] in ".!?" else ".")


def _numbers(rng: random.Random) -> dict[str, str | int]:
    """Names, small numbers, a price, a round total, a percentage, a fraction and items to count."""
    names = dict(zip(("n1", "n2", "n3", "n4"), rng.sample(NAMES, 4)))
    small = {key: rng.randint(2, 20) for key in "abcd"}
    return (
        names
        | small
        | {
            "p": rng.randint(2, 15),
            "i": rng.choice(ITEMS),
            "big": rng.choice([50, 100, 120, 200, 500]),
            "pct": rng.choice([10, 15, 20, 25, 30]),
            "frac": rng.choice(["half", "third", "quarter"]),
        }
    )


def _writing(lex: Lexicon, rng: random.Random) -> str:
    x = lex.pick(rng, "thing", "activity", "place", "idea", "person")
    return rng.choice(WRITE).format(form=rng.choice(FORMS), x=x, r=rng.choice(READERS), c=rng.choice(CONSTRAINTS))


def _explaining(lex: Lexicon, rng: random.Random) -> str:
    x = lex.pick(rng, "idea", "thing", "activity", "place", "group")
    return rng.choice(EXPLAIN).format(x=x, r=rng.choice(READERS))


def _comparing(lex: Lexicon, rng: random.Random) -> str:
    a, b, kind = rng.choice(lex.pairs)
    return rng.choice(COMPARE).format(a=a, b=b, k=kind)


def _role_play(lex: Lexicon, rng: random.Random) -> str:
    return rng.choice(ROLE).format(p=_a(lex.pick(rng, "person")), x=lex.pick(rng, "thing", "activity", "idea"))


def _science(lex: Lexicon, rng: random.Random) -> str:
    if not lex.terms:  # a WordNet without topic domains
        return _explaining(lex, rng)
    term, subject = rng.choice(lex.terms)
    return rng.choice(SCIENCE).format(x=term, f=subject, r=rng.choice(READERS))


def _advice(lex: Lexicon, rng: random.Random) -> str:
    return rng.choice(ADVICE).format(x=lex.pick(rng, "activity", "idea"))


def _brainstorm(lex: Lexicon, rng: random.Random) -> str:
    return rng.choice(BRAINSTORM).format(x=lex.pick(rng, "thing", "activity", "place", "idea"))


def _word_problem(lex: Lexicon, rng: random.Random) -> str:
    return rng.choice(WORD_PROBLEMS).format(**_numbers(rng))


def _puzzle(lex: Lexicon, rng: random.Random) -> str:
    a, b, kind = rng.choice(lex.pairs)
    return rng.choice(PUZZLES).format(x=a, y=b, z=lex.pick(rng, "thing"), k=kind, **_numbers(rng))


def _code(lex: Lexicon, rng: random.Random) -> str:
    task = rng.choice(CODE_TASKS).format(t=lex.pick(rng, "thing"))
    return rng.choice(CODE).format(lang=rng.choice(CODE_LANGUAGES), task=task)


def _rewriting(lex: Lexicon, rng: random.Random) -> str:
    return rng.choice(REWRITE).format(s=_sentence(lex, rng))


def _translating(lex: Lexicon, rng: random.Random) -> str:
    return rng.choice(TRANSLATE).format(lang=rng.choice(MORE_LANGUAGES), s=_sentence(lex, rng))


# each kind of request and its weight among them
KINDS: list[tuple[float, Callable[[Lexicon, random.Random], str]]] = [
    (4, _writing),
    (3, _explaining),
    (2, _science),
    (2, _comparing),
    (1.5, _role_play),
    (1.5, _advice),
    (1.5, _brainstorm),
    (2, _word_problem),
    (1.5, _puzzle),
    (2.5, _code),
    (1.5, _rewriting),
    (1, _translating),
]


def lexicon_requests(limit: int, seed: int = 0, lexicon: Lexicon | None = None) -> list[str]:
    """`limit` distinct requests of every kind in `KINDS`, in a seeded order; none without WordNet."""
    lexicon = lexicon or read_lexicon()
    if lexicon is None or not limit:
        return []
    rng = random.Random(seed + 17)
    weights = [w for w, _ in KINDS]
    made: dict[str, None] = {}
    for _ in range(limit * 3):  # duplicates are rare, but a small lexicon runs out of new ones
        compose = rng.choices(KINDS, weights)[0][1]
        made[compose(lexicon, rng)] = None
        if len(made) == limit:
            break
    return list(made)


__all__ = ["Lexicon", "lexicon_requests", "read_lexicon"]
