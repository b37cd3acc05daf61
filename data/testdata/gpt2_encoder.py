# GPT-2's encoder (openai/gpt-2 src/encoder.py) run on a tokenizer.json's
# vocabulary and merges: prints the ids of a text file as a JSON list.
import json
import sys

import regex


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word):
    return set(zip(word, word[1:]))


spec = json.load(open(sys.argv[1], encoding="utf-8"))
vocab = spec["model"]["vocab"]
merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
ranks = dict(zip(merges, range(len(merges))))
byte_encoder = bytes_to_unicode()


def bpe(token):
    word = tuple(token)
    pairs = get_pairs(word)
    if not pairs:
        return token
    while True:
        bigram = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word = []
        i = 0
        while i < len(word):
            try:
                j = word.index(first, i)
            except ValueError:
                new_word.extend(word[i:])
                break
            new_word.extend(word[i:j])
            i = j
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
        if len(word) == 1:
            break
        pairs = get_pairs(word)
    return " ".join(word)


pat = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
text = open(sys.argv[2], encoding="utf-8", newline="").read()
ids = []
for word in regex.findall(pat, text):
    token = "".join(byte_encoder[b] for b in word.encode("utf-8"))
    ids.extend(vocab[t] for t in bpe(token).split(" "))
print(json.dumps(ids))
