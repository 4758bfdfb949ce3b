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
    return _filled(_TEMPLATES, n, rng, "template:", a_max=12)


def _filled(templates: list[str], n: int, rng, source: str, a_max: int) -> list[dict]:
    """n problems, each template in turn, with people, things and numbers drawn from rng."""
    rows = []
    for i in range(n):
        p, q = rng.sample(_PEOPLE, 2)
        k = i % len(templates)
        text = templates[k].format(
            p=p, q=q, t=rng.choice(_THINGS), place=rng.choice(_PLACES),
            a=rng.randint(2, a_max), b=rng.randint(2, 9), c=rng.randint(2, 9), d=rng.randint(1, 9))
        rows.append({"category": "math", "format": "chat", "source": f"{source}{k}",
                     "licence": "MIT (dflash-gguf)", "prompt": text})
    return rows

# Longer, story-like problems with three or four steps (2026-11-30): the first 30 are short and of few shapes.
_STORY_TEMPLATES = [
    "{p} is planning a party for {a}0 guests. Each guest will eat {b} slices of pizza, and each pizza has 8 slices. Pizzas cost ${c} each. How much will {p} spend on pizza?",
    "{p} wants to buy a bike that costs ${a}00. {p} already saved ${b}0 and earns ${c}0 a week walking dogs. How many weeks until {p} can buy the bike?",
    "A {place} received {a}00 {t} on Monday. It sold a third of them on Tuesday and {b}0 more on Wednesday. How many are left?",
    "{p} drives {a}0 miles to work and back each day, five days a week. The car goes {b}0 miles on a gallon, and gas costs ${c} a gallon. How much does {p} spend on gas in four weeks?",
    "{p} has {a} hours of homework this week. {p} does {b}0 minutes on Monday and twice as long on Tuesday. How many minutes are left?",
    "In a class of {a}0 students, {b}0 percent walk to school, a quarter of the rest come by bus, and the others are driven. How many students are driven?",
    "{p} bought {a} notebooks at ${b} each and {c} pens at $1.50 each, and paid with a $50 bill. How much change did {p} get?",
    "A farmer has {a}0 cows. Each cow gives {b} liters of milk a day, and the farmer sells milk at $2 a liter. How much money does the farmer make in a week?",
    "{p} reads a {a}00-page book. On the first day {p} reads {b}0 pages, and each day after {p} reads 10 more pages than the day before. How many days does it take to finish the book?",
    "{p} is {a} times as old as {q}. In {b} years {p} will be {c}0 years old. How old is {q} now?",
    "A {place} pays its {a} workers ${b}{c} a day each. How much does it pay them all in a month of 22 working days?",
    "{p} fills a pool that holds {a}000 liters using two hoses. One hose gives {b}0 liters a minute and the other {c}0. How many minutes does it take?",
    "{p} sold {a}0 cups of lemonade on Saturday and half as many on Sunday. Each cup sold for 75 cents and the lemons cost ${b}. What was the profit?",
    "A school trip costs ${a}0 per student plus ${b}00 for the bus. If {c}0 students go, how much does each student pay when the bus is shared equally?",
    "{p} runs {a} kilometers on Monday, {b} more on Tuesday than on Monday, and half of Tuesday's distance on Wednesday. How far does {p} run in the three days?",
    "A movie theater has {a} rows of {b}0 seats. For one show {c}0 percent of the seats were sold at ${d}2 each. How much money did the show bring in?",
    "{p} has a garden with {a} tomato plants. Each plant grows {b}0 tomatoes, and {p} gives away {c}0 tomatoes to neighbors. The rest are packed 6 to a box. How many boxes does {p} fill?",
    "{p} earns ${a}0 a day and saves a fifth of it. {p} wants to buy a ${b}00 camera. How many days must {p} work?",
    "A baker makes {a}0 loaves a day and sells each for ${b}. Flour for each loaf costs 80 cents and other costs are ${c}0 a day. How much does the baker earn in a week of six days?",
    "{p} is saving for a trip. The flight costs ${a}00, the hotel is ${b}0 a night for {c} nights, and food is ${d}0 a day. How much does the whole trip cost?",
    "A phone plan costs ${a}0 a month plus ${b} for every gigabyte over 5. {p} used {c}+5 gigabytes last month. What was the bill?",
    "{p} and {q} are painting a fence. {p} paints {a} meters an hour and {q} paints {b} meters an hour. The fence is {c}0 meters long. How long does it take them together?",
    "{p} has ${a}0 in a piggy bank: quarters, dimes and nickels. There are {b}0 quarters and {c}0 dimes. How many nickels are there?",
    "A water park charges ${a}{b} for adults and half that for children. A family of two adults and {c} children visits. How much do they pay?",
]


def story_problem_rows(n: int, rng) -> list[dict]:
    """n problems from the longer templates, each template in turn."""
    return _filled(_STORY_TEMPLATES, n, rng, "template:story", a_max=9)
