"""What reading llama.cpp's nodes costs: ``llama_decode`` with and without
``model_trace.llama_cpp``'s eval callback, interleaved, medians of ``--rounds`` runs.

    python python/benchmarks/llama_cpp_callback.py MODEL.gguf [--threads 1] [--tokens 57] [--rounds 7]

Each round makes a context with the callback and one without, decodes a prompt of ``--tokens``
tokens and then 8 one-token steps, and times each ``llama_decode`` (with its synchronisation).
Only llama.cpp's time: no trace is written.
"""

import argparse
import statistics
import time

import model_trace.llama_cpp as reader


def once(L, model, tokens, threads, with_callback):
    """Prompt time and median decode step time (seconds), and the nodes read."""
    nodes = reader._Nodes(reader._ggml_base(L))
    callback = L.ggml_backend_sched_eval_callback(nodes)
    params = L.llama_context_default_params()
    params.n_ctx = 256
    params.n_batch = params.n_ubatch = max(8, len(tokens))
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if with_callback:
        params.cb_eval = callback
        params.cb_eval_user_data = None
    context = L.llama_init_from_model(model, params)
    batch = L.llama_batch_init(len(tokens), 0, 1)
    times, position = [], 0
    for step in [tokens] + [[7]] * 8:
        for i, token in enumerate(step):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, 1
        batch.n_tokens = len(step)
        nodes.values.clear()
        start = time.perf_counter()
        L.llama_decode(context, batch)
        L.llama_synchronize(context)
        times.append(time.perf_counter() - start)
        position += len(step)
    L.llama_batch_free(batch)
    L.llama_free(context)
    return times[0], statistics.median(times[1:]), len(nodes.values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=57)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    L = reader._llama_cpp()
    reader._quiet(L, False)
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.n_gpu_layers = 0
    model = L.llama_model_load_from_file(args.model.encode(), params)
    tokens = list(range(1000, 1000 + args.tokens))
    results = {False: [], True: []}
    for _ in range(args.rounds):
        for with_callback in (False, True):
            results[with_callback].append(once(L, model, tokens, args.threads, with_callback))
    base = None
    for with_callback in (False, True):
        prompt = statistics.median(r[0] for r in results[with_callback])
        step = statistics.median(r[1] for r in results[with_callback])
        extra = "" if base is None else f" ({prompt / base[0] - 1:+.0%}, {step / base[1] - 1:+.0%})"
        print(f"callback {'on ' if with_callback else 'off'}: prompt of {args.tokens} tokens {prompt * 1e3:.1f} ms, "
              f"decode step {step * 1e3:.2f} ms, nodes read {results[with_callback][0][2]}{extra}")
        base = base or (prompt, step)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
