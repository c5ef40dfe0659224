"""Articles the target writes and then reads: requests for an article (a form, a topic and
invented people, places and figures, so the text has the names and numbers news has), and requests
to summarise, extract from or question the article it wrote (as summaries, extraction and
retrieval-augmented answers read given text). Composed here, never taken from a benchmark.
"""

from __future__ import annotations

import random

from specdeck.train.topics import TOPICS

ARTICLE_FORMS = [
    "a news report",
    "a press release",
    "a short magazine feature",
    "a blog post",
    "a product review",
    "an announcement from a company",
    "an encyclopedia entry",
    "a letter to the editor",
    "a report on a local event",
    "a summary of an interview",
    "a short biography",
    "a report on a scientific study",
    "a travel guide entry",
    "a school newsletter item",
    "a sports match report",
    "a business news story",
    "a weather report",
    "meeting minutes",
    "a court news story",
    "an obituary of a fictional person",
]

PEOPLE = [
    "Maria Lopez",
    "James Chen",
    "Aisha Bello",
    "Tom Becker",
    "Priya Nair",
    "Lars Nilsson",
    "Fatima Haddad",
    "Kenji Watanabe",
    "Olivia Brown",
    "Samuel Okoro",
    "Elena Petrova",
    "David Cohen",
    "Lucia Romano",
    "Ahmed Karim",
    "Grace Kim",
    "Pedro Alves",
    "Hannah Schmidt",
    "Mohammed Ali Khan",
    "Sophie Martin",
    "Ravi Patel",
]

PLACES = [
    "Springfield",
    "Lyon",
    "Osaka",
    "Nairobi",
    "Toronto",
    "Valencia",
    "Krakow",
    "Melbourne",
    "Denver",
    "Porto",
    "Bergen",
    "Austin",
    "Cape Town",
    "Edinburgh",
    "Hanoi",
    "Lima",
    "Dublin",
    "Seattle",
    "Munich",
    "Auckland",
]

ORGANIZATIONS = [
    "the city council",
    "Greenfield University",
    "Northwind Energy",
    "the national weather service",
    "a local hospital",
    "Brightpath Software",
    "the regional museum",
    "Harbor Foods",
    "the health ministry",
    "a community library",
    "Atlas Motors",
    "the football club",
    "Bluewave Telecom",
    "a research institute",
]

ARTICLE_DETAILS = [
    "Mention {person} from {org} and the city of {place}.",
    "Include the year {year}, a figure of {number}, and a quote from {person}.",
    "It takes place in {place} in {year}; {person} is involved.",
    "Include two quotes, one from {person} and one from a spokesperson for {org}.",
    "Mention {org}, {place}, a date in {year} and the number {number}.",
    "",
]

READING_TASKS = [
    "Summarize the following article in two or three sentences.\n\n{a}",
    "Write a one-sentence summary of this text.\n\n{a}",
    "{a}\n\nWhat are the main points of the article above? Answer with bullet points.",
    "Extract the names of people, places, organizations, dates and numbers from the following text, "
    "as a JSON object.\n\n{a}",
    "Read the text and answer: who is involved, what happened, where and when?\n\n{a}",
    "Write a headline and a short summary for this article.\n\n{a}",
    "Here is a document:\n\n{a}\n\nUsing only the document, answer: what is its most important fact, and why?",
    "Write three questions a reader might ask about this text, and answer each one from the text.\n\n{a}",
    "Rewrite the following text in a formal tone, keeping every fact.\n\n{a}",
    "List the key facts in the following text as a table with two columns, fact and detail.\n\n{a}",
    "Document: {a}\n\nQuestion: what does the document say about {t}? Answer from the document.",
    "Give a short critique of the following article: what is clear, and what is missing?\n\n{a}",
]


def article_instructions(limit: int, seed: int = 0) -> list[tuple[str, str]]:
    """(topic, request) pairs asking the target to write an article: a form, a topic and, mostly,
    invented people, places and figures to give its text the names and numbers that news has."""
    rng = random.Random(seed + 3)
    requests = []
    for _ in range(limit):
        topic = rng.choice(TOPICS)
        detail = rng.choice(ARTICLE_DETAILS).format(
            person=rng.choice(PEOPLE),
            place=rng.choice(PLACES),
            org=rng.choice(ORGANIZATIONS),
            year=rng.randint(1990, 2030),
            number=rng.choice([rng.randint(3, 99), rng.randint(100, 50000)]),
        )
        words = rng.choice([120, 150, 200])
        requests.append(
            (topic, f"Write {rng.choice(ARTICLE_FORMS)} of about {words} words about {topic}. {detail}".strip())
        )
    return requests


def reading_instruction(topic: str, article: str, rng: random.Random) -> str:
    """A request to summarise, extract from or question `article` (about `topic`)."""
    return rng.choice(READING_TASKS).format(a=article.strip(), t=topic)
