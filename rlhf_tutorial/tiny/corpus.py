"""A seeded generator of synthetic movie reviews: the text the tiny world is made of.

Every review is a few sentences about a film: an opener (very often "This movie was really <adj>."),
remarks on aspects (acting, plot, score, pacing, dialogue, cinematography, ...), performances, verbs
of liking, comparisons, neutral facts about the story, and sometimes a verdict. Each sentiment-bearing
phrase carries an integer score, and the review's label is a pure function of its text:

    score(phrase) = polarity * strength                  plain adjective    ("dull" -1, "superb" +2)
                  = polarity * (strength + 1)            with an intensifier ("really dull" -2)
                  = polarity * 1                         with a downtoner   ("a bit dull" -1)
                  = -polarity * 1                        negated            ("not bad" +1, "not good" -1)
    score(review) = sum of its phrase scores,  label = POSITIVE (1) if score > 0 else NEGATIVE (0)

Whole reviews are generated with |score| >= 3 and about 70% of them positive (GPT-2 leans positive
too). Reviews are often mixed ("The acting was superb, but the plot was a bit dull."), so the label is
not a single keyword; there is no label noise. ``Review.marks`` records where each phrase's score
becomes known, so a prefix of a review (a partial sample, as the policy produces) has a label too:
the sign of the scores of the phrases it contains (:func:`prefix_score`).

Only the standard library is used: ``random.Random(seed)`` makes the text identical on every machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

POSITIVE, NEGATIVE = 1, 0
POSITIVE_FRACTION = 0.7
MIN_MARGIN = 3
P_MATCH = 0.82

# --- vocabulary -------------------------------------------------------------------------------------
# (word, strength); polarity is given by the list.
POS_STRONG = [
    "superb", "brilliant", "outstanding", "magnificent", "wonderful", "excellent", "fantastic",
    "phenomenal", "breathtaking", "extraordinary", "marvelous", "exceptional", "sublime", "stunning",
    "masterful", "glorious", "dazzling", "terrific", "flawless", "unforgettable",
]
POS_MILD = [
    "good", "nice", "solid", "pleasant", "enjoyable", "charming", "decent", "likable", "engaging",
    "entertaining", "clever", "sweet", "warm", "touching", "memorable", "fresh", "lively", "polished",
    "heartfelt", "moving", "gripping", "funny", "beautiful", "impressive", "compelling", "thoughtful",
    "elegant", "delightful", "smart", "original", "fun", "satisfying", "inventive", "tender", "stylish",
]
NEG_STRONG = [
    "awful", "terrible", "dreadful", "horrible", "atrocious", "abysmal", "unwatchable", "painful",
    "disastrous", "appalling", "excruciating", "pathetic", "insufferable", "wretched", "hideous",
]
NEG_MILD = [
    "bad", "boring", "dull", "weak", "bland", "flat", "clumsy", "messy", "forgettable", "tedious",
    "lazy", "predictable", "silly", "stiff", "shallow", "confusing", "uneven", "tiresome", "mediocre",
    "lifeless", "sloppy", "cheap", "annoying", "awkward", "hollow", "stale", "pointless", "muddled",
    "uninspired", "disappointing",
]
ADJECTIVES: dict[int, list[tuple[str, int]]] = {
    +1: [(w, 2) for w in POS_STRONG] + [(w, 1) for w in POS_MILD],
    -1: [(w, 2) for w in NEG_STRONG] + [(w, 1) for w in NEG_MILD],
}
MILD: dict[int, list[str]] = {+1: POS_MILD, -1: NEG_MILD}

# aspect -> (is_plural, positive words, negative words): mild words that suit that aspect
ASPECTS: dict[str, tuple[bool, list[str], list[str]]] = {
    "acting": (False, ["convincing", "natural", "nuanced"], ["wooden", "hammy", "unconvincing"]),
    "plot": (False, ["intriguing", "tight", "surprising"], ["thin", "contrived", "incoherent"]),
    "score": (False, ["haunting", "rousing", "lovely"], ["grating", "intrusive", "syrupy"]),
    "soundtrack": (False, ["catchy", "rousing", "lovely"], ["grating", "repetitive", "intrusive"]),
    "pacing": (False, ["brisk", "tight", "assured"], ["sluggish", "glacial", "plodding"]),
    "dialogue": (False, ["witty", "sharp", "crisp"], ["clunky", "stilted", "corny"]),
    "cinematography": (False, ["gorgeous", "lush", "striking"], ["murky", "drab", "shaky"]),
    "editing": (False, ["crisp", "sharp", "assured"], ["choppy", "sloppy", "jarring"]),
    "script": (False, ["witty", "smart", "sharp"], ["clunky", "contrived", "lazy"]),
    "ending": (False, ["satisfying", "surprising", "earned"], ["rushed", "abrupt", "contrived"]),
    "lead performance": (False, ["convincing", "nuanced", "magnetic"], ["wooden", "hammy", "vacant"]),
    "supporting cast": (False, ["convincing", "lively", "natural"], ["wooden", "hammy", "vacant"]),
    "direction": (False, ["assured", "confident", "bold"], ["timid", "aimless", "heavy-handed"]),
    "screenplay": (False, ["witty", "intriguing", "sharp"], ["clunky", "contrived", "thin"]),
    "twist": (False, ["surprising", "clever", "earned"], ["obvious", "contrived", "silly"]),
    "final act": (False, ["thrilling", "satisfying", "tense"], ["rushed", "sluggish", "silly"]),
    "first act": (False, ["intriguing", "brisk", "tense"], ["sluggish", "plodding", "thin"]),
    "humor": (False, ["witty", "sharp", "hilarious"], ["corny", "juvenile", "forced"]),
    "romance": (False, ["tender", "sweet", "believable"], ["forced", "syrupy", "unconvincing"]),
    "villain": (False, ["menacing", "chilling", "memorable"], ["cartoonish", "forgettable", "toothless"]),
    "production design": (False, ["lush", "detailed", "gorgeous"], ["cheap", "drab", "tacky"]),
    "lighting": (False, ["moody", "striking", "gorgeous"], ["murky", "flat", "drab"]),
    "sound design": (False, ["immersive", "crisp", "haunting"], ["muddy", "grating", "flat"]),
    "visual effects": (True, ["seamless", "spectacular", "convincing"], ["cheap", "tacky", "unconvincing"]),
    "characters": (True, ["believable", "rich", "likable"], ["thin", "cardboard", "unlikable"]),
    "costumes": (True, ["gorgeous", "detailed", "lavish"], ["tacky", "cheap", "drab"]),
    "action scenes": (True, ["thrilling", "spectacular", "tense"], ["choppy", "confusing", "tedious"]),
    "jokes": (True, ["hilarious", "witty", "sharp"], ["corny", "stale", "forced"]),
    "songs": (True, ["catchy", "lovely", "rousing"], ["forgettable", "grating", "syrupy"]),
    "special effects": (True, ["seamless", "spectacular", "impressive"], ["cheap", "tacky", "dated"]),
}
INTENSIFIERS = [
    "really", "very", "truly", "incredibly", "extremely", "remarkably", "genuinely", "utterly",
    "absolutely", "so", "thoroughly", "exceptionally", "deeply", "wildly",
]
DOWNTONERS = ["a bit", "somewhat", "rather", "slightly", "fairly", "mildly", "a little"]
NEGATORS = ["not", "never", "hardly", "not at all", "far from", "not very", "not particularly"]
NEGATION_WORDS = {"not", "never", "hardly", "nowhere"}

POS_VERBS = [("loved", 2), ("adored", 2), ("enjoyed", 1), ("liked", 1), ("admired", 1), ("appreciated", 1)]
NEG_VERBS = [("hated", 2), ("loathed", 2), ("disliked", 1), ("resented", 1), ("endured", 1)]
# "I did not <verb> the ..." flips the verb's polarity and scores 1.
NEGATED_VERBS = {+1: ["hate", "dislike", "mind", "regret"], -1: ["enjoy", "like", "love", "admire", "care for"]}

VERDICTS: dict[int, list[tuple[str, int]]] = {
    +1: [
        ("I would recommend it to anyone.", 2), ("I would highly recommend it.", 3), ("Do not miss it.", 2),
        ("Worth every minute.", 2), ("I would happily watch it again.", 2), ("Go and see it.", 2),
        ("I left the cinema smiling.", 2), ("A real treat.", 2), ("You will not regret it.", 2),
    ],
    -1: [
        ("I would not recommend it.", 2), ("Avoid it.", 2), ("Do not waste your time.", 2),
        ("A complete waste of time.", 2), ("I want those two hours back.", 2), ("Save your money.", 2),
        ("I walked out halfway through.", 2), ("I would never watch it again.", 2),
        ("I nearly fell asleep.", 2),
    ],
}
RATINGS = {
    +1: ["six", "seven", "eight", "nine", "ten"],
    -1: ["one", "two", "three", "four"],
}
COMPARISONS: dict[int, list[tuple[str, int]]] = {
    +1: [("better than", 1), ("even better than", 2), ("just as good as", 1), ("far better than", 2)],
    -1: [("worse than", 1), ("not as good as", 1), ("nowhere near as good as", 2), ("far worse than", 2)],
}
REFERENCES = ["the book", "the original", "the first film", "the trailer", "the director's last film",
              "the stage play", "the novel", "most films this year", "the sequel"]

FILM_WORDS = ["movie", "film", "picture"]
GENRES = ["thriller", "comedy", "drama", "western", "musical", "horror film", "romance", "war film",
          "mystery", "science fiction film", "fantasy", "biopic", "heist film", "family film", "satire",
          "documentary", "animated film", "crime drama", "spy film", "coming-of-age story"]
FIRST_NAMES = ["Anna", "Ben", "Clara", "David", "Elena", "Frank", "Grace", "Henry", "Iris", "Jack",
               "Kate", "Leo", "Maria", "Nina", "Oscar", "Paul", "Rosa", "Sam", "Tom", "Vera"]
LAST_NAMES = ["Archer", "Baker", "Carter", "Dalton", "Ellis", "Fischer", "Garcia", "Hayes", "Ivanova",
              "Jensen", "Keller", "Lang", "Moreau", "Novak", "Okafor", "Price", "Quinn", "Reyes", "Silva",
              "Tanaka"]
ROLES = ["detective", "teacher", "pilot", "farmer", "nurse", "soldier", "chef", "painter", "journalist",
         "lawyer", "thief", "scientist", "musician", "widow", "boxer", "priest", "sailor", "mayor",
         "student", "spy", "doctor", "singer", "miner", "king"]
PLOTS = [
    "falls in love with a stranger", "searches for a missing brother", "tries to solve a murder",
    "plans one last heist", "returns home after the war", "fights a giant monster",
    "hides a terrible secret", "runs for office", "trains for a big fight", "escapes from prison",
    "inherits an old house", "loses everything in a storm", "joins a travelling circus",
    "takes over a failing restaurant", "uncovers a conspiracy", "raises a child alone",
    "travels across the country", "wakes up with no memory",
]
PLACES = ["Paris", "a small town", "Tokyo", "the desert", "a space station", "Chicago", "a haunted house",
          "the mountains", "New York", "a fishing village", "London", "a remote island", "Rome",
          "the suburbs", "a boarding school", "Berlin", "the jungle"]
COMPANIONS = ["my sister", "my brother", "my wife", "my husband", "my kids", "a friend", "my parents",
              "my roommate", "my grandmother", "some colleagues"]
WHENS = ["on a rainy Sunday", "last night", "on a long flight", "at a festival", "over the weekend",
         "on opening night", "at a late show", "on a Friday night", "last week", "on holiday"]
SOURCES = ["a true story", "a popular novel", "a comic book", "a stage play", "a short story",
           "an old television series", "a video game"]
YEARS = ["1987", "1994", "2003", "2011", "2016", "2019", "2022"]
DURATIONS = ["about two hours", "almost three hours", "ninety minutes", "just under two hours"]


# --- data structures ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sentence:
    """One sentence: its text and, for every scored phrase in it, (character offset where the phrase's
    score becomes known, score)."""

    text: str
    marks: tuple[tuple[int, int], ...] = ()
    negation: bool = False

    @property
    def score(self) -> int:
        return sum(s for _, s in self.marks)


@dataclass(frozen=True)
class Review:
    """A review: sentences joined by single spaces. ``label`` is 1 (POSITIVE) when ``score > 0``."""

    sentences: tuple[Sentence, ...]

    @property
    def text(self) -> str:
        return " ".join(s.text for s in self.sentences)

    @property
    def score(self) -> int:
        return sum(s.score for s in self.sentences)

    @property
    def label(self) -> int:
        return POSITIVE if self.score > 0 else NEGATIVE

    @property
    def has_negation(self) -> bool:
        return any(s.negation for s in self.sentences)

    @property
    def marks(self) -> tuple[tuple[int, int], ...]:
        """(character offset in ``text``, score) for every scored phrase, in order."""
        out, start = [], 0
        for s in self.sentences:
            out += [(start + end, sc) for end, sc in s.marks]
            start += len(s.text) + 1
        return tuple(out)


def prefix_score(review: Review, n_chars: int) -> int:
    """Score of ``review.text[:n_chars]``: the sum over the phrases complete within the prefix."""
    return sum(sc for end, sc in review.marks if end <= n_chars)


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


class _Builder:
    """Assembles one sentence word by word, remembering where scores become known."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.marks: list[tuple[int, int]] = []
        self.negation = False

    def _len(self) -> int:
        return len(" ".join(self.parts))

    def add(self, words: str, score: int = 0, negation: bool = False) -> _Builder:
        if words in {",", ".", "!"} and self.parts:
            self.parts[-1] += words
        else:
            self.parts.append(words)
        if score:
            self.marks.append((self._len(), score))
        self.negation |= negation
        return self

    def done(self, end: str = ".") -> Sentence:
        text = " ".join(self.parts)
        text = text[0].upper() + text[1:] + end
        return Sentence(text, tuple(self.marks), self.negation)


# --- the generator -------------------------------------------------------------------------------------
class ReviewGenerator:
    """Seeded reviews. ``ReviewGenerator(seed).review()`` is deterministic given the seed and call order.

    ``p_match`` is the chance that a sentiment phrase agrees with the review's label; a review is
    resampled until its total score has the label's sign with a margin of at least ``MIN_MARGIN``.
    """

    def __init__(self, seed: int, positive_fraction: float = POSITIVE_FRACTION, p_match: float = P_MATCH,
                 min_margin: int = MIN_MARGIN):
        self.rng = random.Random(seed)
        self.positive_fraction = positive_fraction
        self.p_match = p_match
        self.min_margin = min_margin

    # phrases ------------------------------------------------------------------------------------------
    def _sign(self, label_sign: int, p: float | None = None) -> int:
        return label_sign if self.rng.random() < (self.p_match if p is None else p) else -label_sign

    def predicate(self, b: _Builder, sign: int, aspect: str | None = None, allow_negation: bool = True) -> None:
        """A predicative phrase whose score has sign ``sign``: "really superb", "not bad", "a bit dull"."""
        r, u = self.rng, self.rng.random()
        if allow_negation and u < 0.2:
            neg = r.choice(NEGATORS)
            word = self.adjective(-sign, aspect, mild_only=neg in {"not very", "not particularly"})[0]
            b.add(neg, negation=True).add(word, sign)
        elif u < 0.32:
            b.add(r.choice(DOWNTONERS)).add(self.adjective(sign, aspect, mild_only=True)[0], sign)
        elif u < 0.62:
            word, strength = self.adjective(sign, aspect)
            b.add(r.choice(INTENSIFIERS)).add(word, sign * (strength + 1))
        else:
            word, strength = self.adjective(sign, aspect)
            b.add(word, sign * strength)

    def adjective(self, sign: int, aspect: str | None = None, mild_only: bool = False) -> tuple[str, int]:
        r = self.rng
        if aspect is not None and r.random() < 0.5:
            _, pos, neg = ASPECTS[aspect]
            return r.choice(pos if sign > 0 else neg), 1
        if mild_only:
            return r.choice(MILD[sign]), 1
        return r.choice(ADJECTIVES[sign])

    def aspect(self) -> tuple[str, str]:
        name = self.rng.choice(list(ASPECTS))
        return name, ("were" if ASPECTS[name][0] else "was")

    # sentences -------------------------------------------------------------------------------------
    def opener(self, label_sign: int) -> Sentence:
        r, u = self.rng, self.rng.random()
        sign = self._sign(label_sign, 0.8)
        b = _Builder()
        if u < 0.5:
            b.add("This movie was really")
            if r.random() < 0.08:
                b.add("not", negation=True).add(self.adjective(-sign, mild_only=True)[0], sign)
            else:
                word, strength = self.adjective(sign)
                b.add(word, sign * (strength + 1))
            return b.done()
        if u < 0.85:
            b.add(r.choice(["This movie was", "This movie was", "This film was", "I thought this movie was",
                            "I found this film", "Honestly, this movie was", "This picture was"]))
            self.predicate(b, sign)
            return b.done()
        if u < 0.92:
            word, strength = self.adjective(sign)
            b.add(f"What {_article(word)}").add(word, sign * strength).add(r.choice(FILM_WORDS))
            return b.done(r.choice([".", "!"]))
        return self.neutral()

    def aspect_sentence(self, label_sign: int) -> Sentence:
        name, verb = self.aspect()
        b = _Builder().add(f"the {name} {verb}")
        self.predicate(b, self._sign(label_sign), name)
        return b.done()

    def aspect_pair(self, label_sign: int) -> Sentence:
        r = self.rng
        (a, va), (c, vc) = self.aspect(), self.aspect()
        while c == a:
            c, vc = self.aspect()
        first = self._sign(label_sign)
        kind = r.random()
        b = _Builder()
        if kind < 0.35:  # same polarity
            b.add(f"the {a} {va}")
            self.predicate(b, first, a)
            b.add(",").add(f"and the {c} {vc}")
            self.predicate(b, first, c)
        elif kind < 0.75:  # contrast with "but": the second clause tends to carry the label
            second = self._sign(label_sign)
            if second == first:
                first = -second
            b.add(f"the {a} {va}")
            self.predicate(b, first, a)
            b.add(",").add(f"but the {c} {vc}")
            self.predicate(b, second, c)
        else:
            second = self._sign(label_sign)
            if second == first:
                first = -second
            b.add(f"although the {a} {va}")
            self.predicate(b, first, a)
            b.add(",").add(f"the {c} {vc}")
            self.predicate(b, second, c)
        return b.done()

    def performance(self, label_sign: int) -> Sentence:
        r = self.rng
        sign = self._sign(label_sign)
        name = f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}"
        word, strength = self.adjective(sign)
        b = _Builder().add(f"{name} gives")
        score = sign * strength
        if r.random() < 0.4:
            intensifier = r.choice([w for w in INTENSIFIERS if w != "so"])  # "a so good" is not English
            b.add(_article(intensifier)).add(intensifier)
            score = sign * (strength + 1)
        else:
            b.add(_article(word))
        b.add(word, score).add(f"performance as the {r.choice(ROLES)}")
        return b.done()

    def verb_sentence(self, label_sign: int) -> Sentence:
        r = self.rng
        sign = self._sign(label_sign)
        name, _ = self.aspect()
        b = _Builder().add("I")
        if r.random() < 0.3:
            b.add("did not", negation=True).add(r.choice(NEGATED_VERBS[sign]), sign)
        else:
            verb, strength = r.choice(POS_VERBS if sign > 0 else NEG_VERBS)
            if r.random() < 0.3:
                b.add(r.choice(["really", "truly", "absolutely"]))
                strength += 1
            b.add(verb, sign * strength)
        return b.add(f"the {name}").done()

    def comparison(self, label_sign: int) -> Sentence:
        sign = self._sign(label_sign)
        phrase, strength = self.rng.choice(COMPARISONS[sign])
        b = _Builder().add("it is")
        b.add(phrase, sign * strength, negation=phrase.split()[0] in NEGATION_WORDS)
        return b.add(self.rng.choice(REFERENCES)).done()

    def verdict(self, label_sign: int) -> Sentence:
        r = self.rng
        sign = self._sign(label_sign, 0.92)
        if r.random() < 0.25:
            b = _Builder().add("I give it").add(f"{r.choice(RATINGS[sign])} out of ten", 2 * sign)
            return b.done()
        text, strength = r.choice(VERDICTS[sign])
        negation = any(w in NEGATION_WORDS for w in text.lower().rstrip(".").split())
        return Sentence(text, ((len(text), sign * strength),), negation)

    def neutral(self) -> Sentence:
        r, u = self.rng, self.rng.random()
        if u < 0.3:
            return _Builder().add(
                f"the story follows a {r.choice(ROLES)} who {r.choice(PLOTS)} in {r.choice(PLACES)}").done()
        if u < 0.5:
            watched = r.choice(["I watched this movie", "I saw this film", "I watched it", "I saw it"])
            if r.random() < 0.5:
                return _Builder().add(f"{watched} with {r.choice(COMPANIONS)} {r.choice(WHENS)}").done()
            return _Builder().add(f"{watched} {r.choice(WHENS)}").done()
        if u < 0.65:
            return _Builder().add(f"it is based on {r.choice(SOURCES)}").done()
        if u < 0.8:
            name = f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}"
            return _Builder().add(f"{name} plays the {r.choice(ROLES)}").done()
        if u < 0.9:
            return _Builder().add(
                f"it is a {r.choice(GENRES)} from {r.choice(YEARS)} and runs {r.choice(DURATIONS)}").done()
        name = f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}"
        return _Builder().add(f"it was directed by {name}").done()

    def body_sentence(self, label_sign: int) -> Sentence:
        u = self.rng.random()
        if u < 0.3:
            return self.aspect_sentence(label_sign)
        if u < 0.52:
            return self.aspect_pair(label_sign)
        if u < 0.62:
            return self.performance(label_sign)
        if u < 0.74:
            return self.verb_sentence(label_sign)
        if u < 0.8:
            return self.comparison(label_sign)
        return self.neutral()

    # reviews ----------------------------------------------------------------------------------------
    def review(self, label: int | None = None) -> Review:
        """One review with |score| >= ``min_margin``; ``label`` (1/0) forces the polarity, else ~70% positive."""
        if label is None:
            label = POSITIVE if self.rng.random() < self.positive_fraction else NEGATIVE
        sign = 1 if label == POSITIVE else -1
        while True:
            sentences = [self.opener(sign)]
            sentences += [self.body_sentence(sign) for _ in range(self.rng.randint(2, 4))]
            if self.rng.random() < 0.55:
                sentences.append(self.verdict(sign))
            review = Review(tuple(sentences))
            if review.score * sign >= self.min_margin and len(review.text) <= 420:
                return review

    def reviews(self, n: int) -> list[Review]:
        return [self.review() for _ in range(n)]

    def continuation(self, label_sign: int, n_sentences: int) -> list[Sentence]:
        """Body sentences (no opener), as used for the continuations of preference pairs."""
        return [self.body_sentence(label_sign) for _ in range(n_sentences)]


def generate_reviews(n: int, seed: int) -> list[Review]:
    """``n`` reviews from ``ReviewGenerator(seed)``: the same seed gives the same reviews."""
    return ReviewGenerator(seed).reviews(n)


def vocabulary(reviews: list[Review]) -> set[str]:
    """The distinct lower-cased words (punctuation stripped) of some reviews."""
    return {w.strip(".,!").lower() for r in reviews for w in r.text.split()}


# --- preference pairs ----------------------------------------------------------------------------------
PREFERENCE_RULE = (
    "The simulated rater prefers (1) a fluent continuation over a degenerate one (word 3-gram repetition "
    "rate 1 - unique/total >= 0.4, e.g. a phrase or word said over and over), whatever their sentiment; "
    "and (2) between two fluent continuations, the more positive one (higher corpus sentiment score: the "
    "sum of its phrase scores; pairs differ by at least 3)."
)
DEGENERATE_MIN_REPETITION = 0.4
FLUENT_MAX_REPETITION = 0.1
MIN_PAIR_GAP = 3


def ngram_repetition(text: str, n: int = 3) -> float:
    """``1 - unique / total`` over the word n-grams of ``text.split()``; 0.0 with fewer than n words."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def _join(sentences: list[Sentence]) -> tuple[str, int]:
    return " ".join(s.text for s in sentences), sum(s.score for s in sentences)


class PairGenerator(ReviewGenerator):
    """Preference pairs for a Bradley-Terry reward model, labelled by :data:`PREFERENCE_RULE`.

    Continuations are one or two body sentences whose phrases lean one way with probability 0.9.
    """

    def __init__(self, seed: int):
        super().__init__(seed, p_match=0.9)

    def fluent(self, sign: int | None = None) -> tuple[str, int]:
        while True:
            if sign is None:
                sign = 1 if self.rng.random() < 0.6 else -1
            text, score = _join(self.continuation(sign, self.rng.randint(1, 2)))
            if ngram_repetition(text) <= FLUENT_MAX_REPETITION:
                return text, score

    def degenerate(self) -> tuple[str, int]:
        """A continuation stuck in a loop: a sentence, a clause or one word repeated."""
        r = self.rng
        sign = 1 if r.random() < 0.65 else -1
        u = r.random()
        while True:
            if u < 0.4:  # one short sentence, three or four times
                s = self.aspect_sentence(sign) if r.random() < 0.7 else self.verdict(sign)
                k = r.randint(3, 4)
                text, score = " ".join([s.text] * k), s.score * k
            elif u < 0.75:  # one adjective over and over, possibly with an intensifier
                word, strength = self.adjective(sign)
                k = r.randint(5, 9)
                if r.random() < 0.5:
                    text, score = " ".join([word] * k) + ".", sign * strength * k
                else:
                    text = "It was " + " ".join(["really"] * (k - 1)) + f" {word}."
                    score = sign * (strength + 1)
            else:  # a clause that never finishes
                name, verb = self.aspect()
                b = _Builder().add(f"the {name} {verb}")
                self.predicate(b, sign, name, allow_negation=False)
                clause = b.done("").text
                k = r.randint(3, 4)
                text = " and ".join([clause] + [clause[0].lower() + clause[1:]] * (k - 1)) + "."
                score = sum(sc for _, sc in b.marks) * k
            if ngram_repetition(text) >= DEGENERATE_MIN_REPETITION:
                return text, score

    def pair(self) -> dict:
        prompt = self.opener(1 if self.rng.random() < POSITIVE_FRACTION else -1).text
        if self.rng.random() < 0.55:
            # usually a positive against a negative continuation, sometimes two of the same leaning
            first = 1 if self.rng.random() < 0.5 else -1
            second = -first if self.rng.random() < 0.75 else first
            (a, sa) = self.fluent(first)
            while True:
                b, sb = self.fluent(second)
                if abs(sa - sb) >= MIN_PAIR_GAP:
                    break
            (chosen, sc), (rejected, sr) = ((a, sa), (b, sb)) if sa > sb else ((b, sb), (a, sa))
            kind = "sentiment"
        else:
            chosen, sc = self.fluent()
            want_more_positive = self.rng.random() < 0.6  # so that sentiment alone gets these wrong
            while True:
                rejected, sr = self.degenerate()
                if (sr > sc) == want_more_positive:
                    break
            kind = "repetition"
        return {
            "prompt": prompt,
            "chosen": " " + chosen,
            "rejected": " " + rejected,
            "kind": kind,
            "chosen_score": sc,
            "rejected_score": sr,
        }


def preference_pairs(n: int, seed: int) -> list[dict]:
    """``n`` pairs ``{prompt, chosen, rejected, kind, chosen_score, rejected_score}``; ``prompt + chosen``
    is the text to score. ``kind`` is "sentiment" (both fluent) or "repetition" (rejected is degenerate)."""
    gen = PairGenerator(seed)
    return [gen.pair() for _ in range(n)]


def pair_statistics(pairs: list[dict]) -> dict:
    """Counts, and how far single cues get: always picking the more positive side, or the less repetitive."""

    def frac(flags: list[float]) -> float:
        return sum(flags) / len(flags)

    by_sentiment = [1.0 if p["chosen_score"] > p["rejected_score"] else 0.5 if p["chosen_score"] ==
                    p["rejected_score"] else 0.0 for p in pairs]
    rep = [(ngram_repetition(p["chosen"]), ngram_repetition(p["rejected"])) for p in pairs]
    by_repetition = [1.0 if c < r else 0.5 if c == r else 0.0 for c, r in rep]
    return {
        "n": len(pairs),
        "n_sentiment": sum(p["kind"] == "sentiment" for p in pairs),
        "n_repetition": sum(p["kind"] == "repetition" for p in pairs),
        "accuracy_of_sentiment_alone": frac(by_sentiment),
        "accuracy_of_repetition_alone": frac(by_repetition),
    }
