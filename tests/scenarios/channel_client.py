"""Ranks train with an all_reduce per step; at step 2, rank WAIT_RANK calls the rollout server
at 127.0.0.1:SERVER_PORT through a real client (CLIENT): TRL's VLLMClient.update_named_param
("trl"), swift's VLLMInferClient.infer ("swift-infer") or swift's VLLMClient.init_communicator,
whose weight-update group the server never joins ("swift-group", group port GROUP_PORT). The
server answers /health and /get_world_size and never answers the rest; the other ranks wait in
the all_reduce."""
import os
import time

import torch
import torch.distributed as dist

WAIT_RANK = int(os.environ.get("WAIT_RANK", "0"))
URL = f"http://127.0.0.1:{os.environ.get('SERVER_PORT', '8000')}"


def sync_weights_with_trl() -> None:
    from trl.generation.vllm_client import VLLMClient
    client = VLLMClient(base_url=URL, connection_timeout=10)
    client.update_named_param("model.embed_tokens.weight", torch.zeros(4, 2))


def rollout_with_swift() -> None:
    from swift.rlhf_trainers.vllm_client import VLLMInferClient
    client = VLLMInferClient(base_urls=[URL], connection_timeout=10)
    client.infer([{"messages": [{"role": "user", "content": "2+2?"}]}])


def join_weight_group_with_swift() -> None:
    from swift.rlhf_trainers.vllm_client import VLLMClient
    client = VLLMClient(base_urls=[URL], group_ports=int(os.environ["GROUP_PORT"]),
                        connection_timeout=10)
    client.init_communicator(device="cpu")


CLIENTS = {"trl": sync_weights_with_trl, "swift-infer": rollout_with_swift,
           "swift-group": join_weight_group_with_swift}


def main() -> None:
    dist.init_process_group("gloo")
    for step in range(5):
        if step == 2 and dist.get_rank() == WAIT_RANK:
            CLIENTS[os.environ["CLIENT"]]()
        dist.all_reduce(torch.ones(8))
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
