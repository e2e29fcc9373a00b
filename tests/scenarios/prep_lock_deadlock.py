"""A dataset preparation script with no torch at all (as RL pipelines run before training:
tokenise and filter prompts, write shards): worker threads tokenise shards and report progress
through a shared lock; a worker that hits a malformed record returns from its error path while
holding the lock, and the main thread's next progress report waits on it for good. The hang
begins in the first seconds, well before a slow job would have done anything.

Prints ``shard N`` per shard, then ``hang begins`` as the last one."""
import threading
from concurrent.futures import ThreadPoolExecutor

progress_lock = threading.Lock()
done: list[int] = []


def tokenize(shard: int) -> int:
    words = [f"prompt {shard}-{i}: what is {i} + {shard}?" for i in range(20000)]
    tokens = sum(len(w.split()) for w in words)
    progress_lock.acquire()
    if shard == 3:          # a malformed record: the error path returns, the lock stays taken
        return -1
    done.append(shard)
    progress_lock.release()
    return tokens


def main() -> None:
    with ThreadPoolExecutor(2) as pool:
        for shard, tokens in enumerate(pool.map(tokenize, range(3))):
            print(f"shard {shard}: {tokens} tokens", flush=True)
        # the last shard once the others are written (a worker still tokenising would
        # otherwise wait on the lock too, and the pool would never finish)
        print(f"shard 3: {pool.submit(tokenize, 3).result()} tokens", flush=True)
    print("hang begins", flush=True)
    with progress_lock:     # the final report: waits for the lock the worker kept
        print(f"{len(done)} shards written", flush=True)


if __name__ == "__main__":
    main()
