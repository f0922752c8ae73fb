"""Every generated token of an answer from one call against one call per token, on a LLaVA-style
model with random weights built from a config (nothing downloaded), side by side in one run.

    python benchmarks/vlm.py [--tokens 16] [--size 224] [--layers 4] [--rounds 5] [--device cpu]

Rows: ``explain_tokens`` (one forward over the answer, the N tokens as N targets of batched
backward passes, ``token_batch`` = N), the same with ``token_batch=4`` (bounded memory), and N
separate ``GradCAM`` calls with one ``TokenTarget`` each; then one token's LRP (AttnLRP through
the vision tower and the language model, ``epsilon-plus``) against ``Saliency`` (one plain
forward and backward to the pixels, the floor; target <= 1.5x). The calls alternate, ``--rounds``
times, and the median is reported; one thread on the CPU, timed in CPU seconds of this process
(``time.process_time``: the machine may be shared), wall seconds on a GPU. Target (issue 34): the
one call <= 0.6x the N calls (each token still needs its own backward, so about 0.5x is the floor
on a CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import transformers

import camkit
from camkit.methods.cam.generation import explain_tokens
from camkit.targets import TokenTarget


def model(size: int, layers: int, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    vision = dict(model_type="clip_vision_model", hidden_size=256, intermediate_size=1024)
    vision |= dict(num_attention_heads=4, image_size=size, patch_size=16, num_hidden_layers=layers)
    text = dict(
        model_type="llama", hidden_size=256, intermediate_size=688, num_hidden_layers=layers
    )
    text |= dict(num_attention_heads=8, num_key_value_heads=2, vocab_size=1000)
    config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_id=4)
    return transformers.LlavaForConditionalGeneration(config).eval().to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    llava = model(args.size, args.layers, args.device)
    patches = (args.size // 16) ** 2
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, args.size, args.size, generator=generator).to(args.device)
    prompt = [1] + [4] * patches + torch.randint(5, 1000, (8,), generator=generator).tolist()
    answer = torch.randint(5, 1000, (args.tokens,), generator=generator).tolist()
    sequence = torch.tensor([prompt + answer], device=args.device)
    cam = camkit.GradCAM(camkit.KeywordInput(llava, "pixel_values"))
    positions = range(len(prompt), sequence.shape[1])

    gpu = args.device.startswith("cuda")
    clock = time.perf_counter if gpu else time.process_time

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    def one_call(token_batch: int | None) -> None:
        explain_tokens(cam, x, sequence, prompt_length=len(prompt), token_batch=token_batch)

    def separate() -> None:
        for position in positions:
            target = TokenTarget(position, int(sequence[0, position]))
            cam(x, target, additional_forward_args={"input_ids": sequence})

    last = TokenTarget(-1, int(sequence[0, -1]))
    extra = {"input_ids": sequence}
    saliency = camkit.Saliency(camkit.KeywordInput(llava, "pixel_values"))
    lrp = camkit.LRP(camkit.KeywordInput(llava, "pixel_values"), composite="epsilon-plus")
    rows = {
        "one token: Saliency (forward + backward)": lambda: saliency(
            x, last, additional_forward_args=extra
        ),
        "one token: LRP (AttnLRP)": lambda: lrp(x, last, additional_forward_args=extra),
        f"explain_tokens, {args.tokens} tokens, one backward batch": lambda: one_call(None),
        f"explain_tokens, {args.tokens} tokens, token_batch=4": lambda: one_call(4),
        f"{args.tokens} GradCAM calls, one token each": separate,
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    with warnings.catch_warnings():  # LRP's conservation of random weights: not timed here
        warnings.simplefilter("ignore")
        for run in rows.values():  # warm-up
            run()
    for _ in range(args.rounds):
        for name, run in rows.items():
            sync()
            start = clock()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run()
            sync()
            times[name].append(clock() - start)
    separate_time = statistics.median(times[f"{args.tokens} GradCAM calls, one token each"])
    floor = statistics.median(times["one token: Saliency (forward + backward)"])
    device = torch.cuda.get_device_name() if gpu else "CPU, 1 thread, CPU seconds"
    print(f"| LLaVA-style, {args.layers}+{args.layers} layers, {args.size} px, {device} | s | x |")
    print("| --- | --- | --- |")
    for name, measured in times.items():
        median = statistics.median(measured)
        base = floor if name.startswith("one token") else separate_time
        print(f"| {name} | {median:.3f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
