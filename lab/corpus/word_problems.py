"""Grade-school word problems from templates written for this project (MIT): a small share of the math
prompts; most are written by the target itself from seeds (see self_instruct.py)."""

from __future__ import annotations

_PEOPLE = ["Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira", "Luis", "Mei",
           "Noah", "Olu", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zoe",
           "Mr. Lopez", "Ms. Chen", "Grandma Ruth", "Coach Adams"]
_THINGS = ["apples", "pencils", "stickers", "cookies", "marbles", "books", "trading cards", "shells", "stamps",
           "cupcakes", "tomatoes", "eggs", "bricks", "seeds", "candles", "bottles of juice", "toy cars", "beads"]
_PLACES = ["bakery", "farm", "library", "school fair", "bookstore", "garden center", "toy shop", "zoo", "cafe",
           "hardware store", "market stall", "bike shop"]
_TEMPLATES = [
    "{p} has {a} {t}. {p} buys {b} packs with {c} {t} in each pack and gives {d} {t} to {q}. How many {t} does {p} have now?",
    "A {place} sells {t} for ${a} each. {p} buys {b} of them and pays with ${c}0. How much change does {p} get?",
    "{p} reads {a} pages every weekday and {b} pages on each weekend day. How many pages does {p} read in {c} weeks?",
    "A train travels at {a}0 km per hour for {b} hours, then at {c}0 km per hour for {d} hours. How far does it go in total?",
    "{p} earns ${a} per hour and works {b} hours a day for {c} days, then spends ${d}0. How much money is left?",
    "There are {a}0 students at a {place} event. {b}0 percent of them are under ten, and half of the rest are adults. How many adults are there?",
    "{p} baked {a}0 {t}. {q} took {b} of them and {p} packed the rest equally into {c} boxes. How many are in each box, and how many are left over?",
    "A garden is {a} meters long and {b} meters wide. A fence costs ${c} per meter. How much does it cost to fence the garden?",
    "{p} is {a} years old. {q} is {b} years older than twice {p}'s age. How old will {q} be in {c} years?",
    "A recipe needs {a} cups of flour for {b} dozen muffins. How many cups are needed for {c} dozen muffins?",
    "{p} saves ${a} in the first month and ${b} more each month than the month before. How much is saved after {c} months?",
    "A tank holds {a}00 liters and is half full. Water flows in at {b} liters per minute and out at {c} liters per minute. How long until it is full?",
    "The {place} had {a}00 visitors on Monday. Each day after, it had {b} percent more than the day before. About how many visitors came on Wednesday?",
    "{p} runs {a} laps of a {b}00-meter track each morning. How many kilometers does {p} run in {c} days?",
    "A box of {t} costs ${a}. A sale takes {b}0 percent off. {p} buys {c} boxes. What is the total cost?",
    "{p} and {q} share {a}0 {t} in the ratio {b}:{c}. How many {t} does each get?",
    "A car uses {a} liters of fuel per 100 km. Fuel costs ${b} per liter. How much does a {c}00 km trip cost?",
    "{p} plants {a} rows of {t} with {b} in each row. {c} of them do not grow. How many grow?",
    "The perimeter of a rectangle is {a}0 cm and its length is {b} cm more than its width. What is its area?",
    "A {place} opens at 9 a.m. and closes at {a} p.m. It serves {b}0 customers per hour on average. How many customers does it serve in {c} days?",
    "{p} has ${a}0. {p} spends a quarter of it on {t} and {b}0 percent of the rest on a ticket. How much is left?",
    "A bus has {a}0 seats. At the first stop {b} people get off and {c} get on; at the second stop {d} get off. If it started full, how many people are on it now?",
    "Three friends split a bill of ${a}{b}.{c}0 equally and each adds a ${d} tip. How much does each pay?",
    "A printer prints {a} pages per minute. How many minutes does it take to print {b} copies of a {c}0-page report?",
    "{p} is thinking of a number. Doubling it and adding {a} gives {b}0. What is the number?",
    "The average of four test scores is {a}{b}. Three of the scores are {c}0, {d}5 and {a}8. What is the fourth score?",
    "A {place} buys {t} at ${a} each and sells them at ${b} each. How many must it sell to make ${c}00 profit?",
    "{p} walks {a} km in {b} minutes. At that speed, how long does a {c} km walk take?",
    "A water bottle holds {a}00 ml. {p} drinks {b} bottles a day. How many liters is that in {c} weeks?",
    "A shelf holds {a} books. A library has {b}00 books and {c} shelves. How many more shelves does it need?",
]


def word_problem_rows(n: int, rng) -> list[dict]:
    rows = []
    for i in range(n):
        p, q = rng.sample(_PEOPLE, 2)
        text = _TEMPLATES[i % len(_TEMPLATES)].format(
            p=p, q=q, t=rng.choice(_THINGS), place=rng.choice(_PLACES),
            a=rng.randint(2, 12), b=rng.randint(2, 9), c=rng.randint(2, 9), d=rng.randint(1, 9))
        rows.append({"category": "math", "format": "chat", "source": f"template:{i % len(_TEMPLATES)}",
                     "licence": "MIT (dflash-gguf)", "prompt": text})
    return rows
