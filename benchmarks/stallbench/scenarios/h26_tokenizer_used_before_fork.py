"""DataLoader workers forked while the tokenizer's pre-tokenize thread held its cache lock

source: https://github.com/huggingface/tokenizers/issues/187, https://github.com/huggingface/tokenizers/issues/258
shape: a single-process training script that pre-tokenizes its corpus with a fast tokenizer's
  encode_batch in a background thread pool (behind a lock that guards the encoding cache), then
  iterates a DataLoader(num_workers=2) whose collate_fn tokenizes with the same object; the workers
  fork while a pool thread holds the lock, and in each child it has no owner. Current tokenizers
  disables its own Rayon pool in a forked child (TOKENIZERS_PARALLELISM unset), so the
  fork-after-threads deadlock here is on the script's own lock, the notes' generic recipe
launch: python
truth: hang
culprit: worker0, worker1
frame: encode_batch
cause: python_deadlock
needs: torch, tokenizers
"""
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from torch.utils.data import DataLoader, Dataset, get_worker_info

import jobkit

WORDS = ("the model reads every review and scores its sentiment before the next epoch starts "
         "good bad great awful fine terrible excellent boring fun slow fast cheap").split()


def synthetic_reviews(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) for _ in range(count)]


def train_tokenizer(corpus: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]", "[PAD]"]))
    tokenizer.enable_padding(pad_id=1, pad_token="[PAD]", length=48)
    tokenizer.enable_truncation(48)
    return tokenizer


class CachedTokenizer:
    """The fast tokenizer plus a cache of encodings, filled by background pre-tokenize threads."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[str, list[int]] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pretokenize")

    def _fill(self, texts: list[str]) -> None:
        with self.lock:
            for text, encoding in zip(texts, self.tokenizer.encode_batch(texts)):
                self.cache[text] = encoding.ids

    def prefetch(self, corpus: list[str], chunk: int = 4000) -> None:
        for start in range(0, len(corpus), chunk):
            self.pool.submit(self._fill, corpus[start:start + chunk])

    def encode_batch(self, texts: list[str]) -> torch.Tensor:
        with self.lock:
            missing = [text for text in texts if text not in self.cache]
            for text, encoding in zip(missing, self.tokenizer.encode_batch(missing)):
                self.cache[text] = encoding.ids
            return torch.tensor([self.cache[text] for text in texts])


class Reviews(Dataset):
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.labels = [int("good" in text or "great" in text) for text in texts]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int):
        return self.texts[index], self.labels[index]


class Collate:
    def __init__(self, tokenizer: CachedTokenizer) -> None:
        self.tokenizer = tokenizer
        self.first = True

    def __call__(self, batch):
        texts, labels = zip(*batch)
        if self.first:
            self.first = False
            jobkit.hang_begins("a forked DataLoader worker takes the tokenizer's cache lock")
        return self.tokenizer.encode_batch(list(texts)), torch.tensor(labels)


def announce_worker(worker_id: int) -> None:
    jobkit.announce(f"worker{get_worker_info().id}")


def main() -> None:
    jobkit.announce("trainer")
    corpus = synthetic_reviews(120_000)
    tokenizer = CachedTokenizer(train_tokenizer(corpus[:2000]))
    tokenizer.prefetch(corpus)                     # pre-tokenize in the background
    loader = DataLoader(Reviews(corpus[:4096]), batch_size=64, shuffle=True, num_workers=2,
                        collate_fn=Collate(tokenizer), worker_init_fn=announce_worker)
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(300, 32), torch.nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for step, (ids, labels) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(ids), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            jobkit.step(step)
            time.sleep(0.05)
        print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
