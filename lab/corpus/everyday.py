"""Everyday assistant requests from templates and topic lists written for this project (MIT): the writing,
advice, explaining, planning and role-play requests people send a chat app, which the package, man-page and
API prompts of the other sources do not cover. Each row pairs one request form with one topic. The forms are
generic request shapes, none modelled on an evaluation prompt; lab/make_everyday_mix.py still drops any row
that shares an 8-word run with one."""

from __future__ import annotations

_PLACES = ["Japan", "Italy", "Iceland", "Morocco", "Peru", "Canada", "New Zealand", "Kenya", "Portugal", "Vietnam",
           "Norway", "Mexico", "Greece", "Scotland", "Chile", "Egypt", "Thailand", "Ireland", "Australia", "India"]

_TOPICS = [
    "learning to cook", "saving money", "running a first marathon", "keeping houseplants alive", "moving to a new city",
    "starting a vegetable garden", "working from home", "learning a second language", "adopting a rescue dog",
    "planning a wedding", "getting better sleep", "public speaking", "writing a novel", "learning to swim",
    "volunteering", "composting", "buying a used car", "first day at a new job", "camping in the mountains",
    "baking sourdough bread", "training for a chess tournament", "reducing screen time", "birdwatching",
    "renovating a kitchen", "raising chickens", "learning the guitar", "studying for exams", "riding a bike to work",
    "hosting a dinner party", "recycling electronics", "starting a podcast", "painting with watercolors",
    "caring for an elderly parent", "keeping a journal", "negotiating a salary", "making friends as an adult",
    "visiting a museum", "taking better photos with a phone", "packing for a long flight", "learning to knit",
    "brewing coffee at home", "organizing a closet", "teaching a child to read", "running a small bakery",
    "climate change", "the history of the printing press", "how volcanoes form", "the water cycle",
    "the invention of the telephone", "honeybees", "the moon landing", "ancient Rome", "the Silk Road",
    "renewable energy", "the human immune system", "black holes", "the French Revolution", "electric cars",
    "coral reefs", "the Industrial Revolution", "how vaccines work", "the Great Wall of China", "rainforests",
    "the Olympic Games", "plate tectonics", "the history of jazz", "the Renaissance", "desert animals",
    "how airplanes fly", "the invention of paper", "photosynthesis", "the solar system", "earthquakes",
    "the history of chocolate", "Antarctica", "the internet", "migrating birds", "the stock market",
    "a small island nation", "a busy night market", "a mountain village in winter", "a lighthouse keeper",
    "a robot that learns to paint", "a lost umbrella", "a time traveler in a library", "a dragon who is afraid of fire",
    "a detective who solves crimes with smells", "a city where it never stops raining", "an old sailing ship",
    "a friendly ghost", "a cat who runs a bookstore", "a spaceship crew far from home", "a forgotten letter",
    "a street musician", "a village baker", "twins separated at birth", "a talking tree", "a summer festival",
    "smartphones", "online shopping", "electric scooters", "remote learning", "social media", "video games",
    "public transport", "fast food", "self-driving cars", "streaming services", "e-books", "smart watches",
    "a four-day work week", "school uniforms", "homework", "zoos", "space tourism", "tiny houses", "city parks",
    "a local library", "a neighborhood cleanup", "a charity bake sale", "a science fair", "a book club",
    "a family reunion", "a company picnic", "a school play", "a hiking club", "a community garden",
] + _PLACES

_ROLES = [
    "a tour guide", "a chef", "a personal trainer", "a librarian", "a ship captain", "a detective",
    "a kindergarten teacher", "a park ranger", "a museum curator", "an astronaut", "a travel agent",
    "a career coach", "a medieval knight", "a barista", "a gardener", "a news reporter", "a pirate",
    "a job interviewer", "a sports commentator", "a wise old owl",
]

_PAIRS = [
    ("tea", "coffee"), ("cats", "dogs"), ("trains", "planes"), ("paper books", "e-books"), ("renting", "buying a home"),
    ("city life", "country life"), ("summer", "winter"), ("running", "swimming"), ("Python", "JavaScript"),
    ("working alone", "working in a team"), ("the beach", "the mountains"), ("cooking at home", "eating out"),
    ("laptops", "tablets"), ("early mornings", "late nights"), ("studying alone", "studying in a group"),
    ("buses", "bicycles"), ("board games", "video games"), ("a big wedding", "a small wedding"),
]

_FORMS = [
    "Write a short blog post about {topic}.",
    "Give me five practical tips for {topic}.",
    "Explain {topic} to a ten-year-old.",
    "Write a short story about {topic}.",
    "Write a poem about {topic}.",
    "What are the pros and cons of {topic}?",
    "Summarize the most important facts about {topic} in one paragraph.",
    "Write a persuasive paragraph in favor of {topic}.",
    "Create a list of ten questions someone might ask about {topic}.",
    "Write an email to a friend telling them about {topic}.",
    "Draft a short speech for an event about {topic}.",
    "I want to get started with {topic}. What should I do first?",
    "What are common mistakes people make with {topic}, and how can they avoid them?",
    "Write a product description for something related to {topic}.",
    "Write a dialogue between two friends discussing {topic}.",
    "Make a step-by-step plan for {topic}.",
    "Write a funny limerick about {topic}.",
    "Give me three interesting facts about {topic} that most people do not know.",
    "Write a short news article about {topic}.",
    "Outline an essay about {topic}, with an introduction, three main points and a conclusion.",
    "Write a social media post announcing something about {topic}. Keep it under 60 words.",
    "How would you explain {topic} to someone from the year 1900?",
    "Write a diary entry from someone experiencing {topic} for the first time.",
    "Create a short quiz with four multiple-choice questions about {topic}.",
    "Write a review of a book about {topic}.",
    "Suggest a weekend schedule that includes {topic}.",
    "Rewrite this sentence to sound more formal: \"I really love stuff about {topic}.\"",
]

_ROLE_FORMS = [
    "Pretend you are {role}. Introduce yourself and describe a typical day.",
    "You are {role}. Give advice to someone who is interested in {topic}.",
    "Act as {role} and answer this: what is the most surprising thing about {topic}?",
    "Imagine you are {role}. Write a short letter to a young person about {topic}.",
]

_PAIR_FORMS = [
    "Compare {a} and {b}. Which would you recommend, and why?",
    "Write a short debate between someone who prefers {a} and someone who prefers {b}.",
    "List three ways {a} and {b} are similar and three ways they differ.",
]

_TRIP_FORMS = [
    "Plan a {n}-day trip to {place} for a family with two children.",
    "What should I pack for a trip to {place} in the {season}?",
]
_SEASONS = ["spring", "summer", "autumn", "winter"]


def everyday_rows(n: int, rng) -> list[dict]:
    """n distinct requests: topic forms (most), role-play, comparisons and trips, in a fixed seeded order."""
    candidates = [("topic", f, t) for f in _FORMS for t in _TOPICS]
    candidates += [("role", f, (r, t)) for f in _ROLE_FORMS for r in _ROLES for t in _TOPICS[:60]]
    candidates += [("pair", f, p) for f in _PAIR_FORMS for p in _PAIRS]
    candidates += [("trip", f, (pl, s)) for f in _TRIP_FORMS for pl in _PLACES for s in _SEASONS]
    rng.shuffle(candidates)
    rows = []
    for kind, form, arg in candidates[:n]:
        if kind == "topic":
            text = form.format(topic=arg)
        elif kind == "role":
            text = form.format(role=arg[0], topic=arg[1])
        elif kind == "pair":
            text = form.format(a=arg[0], b=arg[1])
        else:
            text = form.format(n=rng.randint(3, 7), place=arg[0], season=arg[1])
        rows.append({"category": "chat", "format": "chat", "source": f"everyday:{kind}",
                     "licence": "MIT (dflash-gguf)", "prompt": text})
    return rows
