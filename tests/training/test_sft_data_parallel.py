"""Data-parallel SFT's arithmetic (`training.sft.DataParallel`), without a process group: the processes' shares of
a batch partition it, and their gradients (each share's summed loss over the whole batch's labelled tokens),
summed, are the one-process gradient of the batch's mean loss. The launched version (two processes under
`accelerate launch`, gloo) is tests/stages/test_train_sft.py::test_accelerate_two_processes_train_what_one_does."""

from __future__ import annotations

from types import SimpleNamespace

import tinymodel  # noqa: E402

from trace_cli.training.sft import DataParallel, assistant_loss, demonstrations, fit_examples, pad_batch


def test_shares_partition_a_batch():
    rows = list(range(7))
    shares = [DataParallel(SimpleNamespace(num_processes=3, process_index=r)).share(rows) for r in range(3)]
    assert sorted(x for s in shares for x in s) == rows and all(shares)
    assert DataParallel(None).share(rows) == rows and not DataParallel(None).active


def test_summed_share_gradients_are_the_batch_gradient(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny = tinymodel.tiny(tmp_path_factory)
    tok = AutoTokenizer.from_pretrained(tiny.hf)
    demos = demonstrations("shop", [100000 + i for i in range(5)], set(), deficit_rate=1.0, seed=0)
    ex = fit_examples(tok, demos, 4096, 4096, "assistant")
    model = AutoModelForCausalLM.from_pretrained(tiny.hf)
    params = [p for p in model.parameters() if p.requires_grad]

    def grads(rows, total=None):
        model.zero_grad(set_to_none=True)
        ids, att, labels = pad_batch([ex[j] for j in rows], tok.pad_token_id)
        if total is None:
            loss = assistant_loss(model, ids, att, labels)
        else:
            loss = assistant_loss(model, ids, att, labels, reduction="sum") / total
        loss.backward()
        return [p.grad.detach().clone() for p in params]

    batch = list(range(len(ex)))
    labelled = sum(int((pad_batch([ex[j]], 0)[2][:, 1:] != -100).sum()) for j in batch)
    whole = grads(batch)
    parts = [grads(DataParallel(SimpleNamespace(num_processes=2, process_index=r)).share(batch), labelled)
             for r in range(2)]  # fmt: skip
    for w, a, b in zip(whole, parts[0], parts[1], strict=True):
        # the same sum in another order (two padded batches instead of one): a float tolerance
        assert torch.allclose(a + b, w, atol=1e-6, rtol=1e-4)
