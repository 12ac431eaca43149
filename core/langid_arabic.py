"""Arabic-script letters as a prior on short texts: Arabic, Persian and Urdu share one script, not one alphabet.

On a word or two in Arabic script, fastText and lingua confuse the three languages that write it most (a short
Urdu phrase such as "ایک کہانی" reads as Persian to both). Their alphabets differ in letters each of them
writes every few words, which settle what the models leave open:

- Urdu's own letters (`URDU_LETTERS`: retroflex ٹ ڈ ڑ, nun ghunna ں, gol he ہ, do-chashmi he ھ, bari ye ے) are
  neither Arabic nor Persian: a text with one of them is not Arabic and not Persian.
- The letters Persian and Urdu add to Arabic (`PERSIAN_URDU_LETTERS`: پ چ ژ گ, and their own kaf ک and ye ی)
  are not Arabic: a text with one of them, and no letter only Arabic writes, is not Arabic.
- The letters only Arabic writes of the three (`ARABIC_LETTERS`: ta marbuta ة, alif maqsura ى, Arabic ye ي and
  kaf ك, hamza on alif أ إ) rule out Persian and Urdu, where no Persian or Urdu letter is there too: older
  Persian text typed on Arabic keyboards writes ي and ك, and then usually other Persian letters beside them.

`core.langid` weighs a ruled-out language down (`RULED_OUT_WEIGHT`), never to zero: a quoted name can carry a
foreign letter. On the data pack's Arabic prompts (train and train/more, 7,121) no two-word cut holds a
Persian or Urdu letter; on the Persian gettext catalogs (839 messages) 0.2 % hold an Arabic-only letter.
What the rules give up: Arabic-script languages that write these letters too (Sindhi, Punjabi in Shahmukhi,
Kashmiri, Uyghur, Sorani Kurdish) are never ruled out by them, so they keep the models' view; only the three
named here are.

Bounded cost: one `str.isascii` call for an ASCII text, else one set intersection over the first
`SCAN_CHARS` characters.
"""

from __future__ import annotations

import re

SCAN_CHARS = 96  # as core.langid_script: the head shows the script, whatever the length

URDU_LETTERS = frozenset("\u0679\u0688\u0691\u06ba\u06c1\u06c2\u06be\u06d2\u06d3")  # ٹ ڈ ڑ ں ہ ۂ ھ ے ۓ
PERSIAN_URDU_LETTERS = frozenset("\u067e\u0686\u0698\u06af\u06a9\u06cc")  # پ چ ژ گ ک ی
ARABIC_LETTERS = frozenset("\u0629\u0649\u064a\u0643\u0623\u0625")  # ة ى ي ك أ إ
_ARABIC_SCRIPT = re.compile("[\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufeff]")

NOT_ARABIC_OR_PERSIAN = frozenset({"ar", "fa"})
NOT_ARABIC = frozenset({"ar"})
NOT_PERSIAN_OR_URDU = frozenset({"fa", "ur"})
# The languages these rules speak about: a text in Arabic script is one of them far more often than anything
# else, so short-text detection asks lingua and the word tables about all three when one of them leads.
LANGUAGES = frozenset({"ar", "fa", "ur"})


def ruled_out(text: str) -> frozenset[str]:
    """The languages among Arabic, Persian and Urdu whose alphabet lacks a letter of ``text``'s head; empty
    for a text with no Arabic-script letter (any ASCII text: one `isascii` call)."""
    if text.isascii():
        return frozenset()
    head = text[:SCAN_CHARS]
    if _ARABIC_SCRIPT.search(head) is None:
        return frozenset()
    letters = set(head)
    if not letters.isdisjoint(URDU_LETTERS):
        return NOT_ARABIC_OR_PERSIAN
    persian = not letters.isdisjoint(PERSIAN_URDU_LETTERS)
    arabic = not letters.isdisjoint(ARABIC_LETTERS)
    if persian and not arabic:
        return NOT_ARABIC
    if arabic and not persian:
        return NOT_PERSIAN_OR_URDU
    return frozenset()
