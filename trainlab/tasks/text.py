"""The text task: token ids to classes, cross-entropy, accuracy, measured against a TF-IDF baseline; its
evaluation adds attention maps (Transformer) or the most weighted n-grams per class (n-gram bag)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.core.config import TextParams
from trainlab.core.errors import CheckpointError, DataError, ParamsError
from trainlab.engine.contract import Trainable
from trainlab.models.text import build_text_model
from trainlab.tasks.base import TaskCode, TrainingExtras
from trainlab.tasks.metrics import METRICS, primary, validation_metrics

if TYPE_CHECKING:
    from trainlab.core.config import Params
    from trainlab.core.runtime import Runtime
    from trainlab.engine.loop import FitResult
    from trainlab.tasks.scoring import TaskInputs, TaskReport

TOP_NGRAMS = 12  # n-grams per class in the n-gram bag's picture
NGRAM_ARCHS = ("ngram_bag", "nb_bag", "tfidf_bag")  # text.arch values whose picture is the n-gram table


def text_trainable(model: nn.Module, num_classes: int, label_smoothing: float = 0.0) -> Trainable:
    def prepare(batch, train, gen):
        return batch["tokens"], batch["labels"]

    if getattr(model, "weight_decays", ()):
        return candidates_trainable(model, num_classes, label_smoothing, prepare)

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)

    def metrics():
        return validation_metrics(METRICS["text"], num_classes)

    return Trainable("text", model, loss_fn, metrics, prepare, primary(METRICS["text"]).name, conv=False)


@dataclass
class CandidatesTrainable(Trainable):
    """The text task of a model with one head per candidate weight decay: logits (N, K, classes)."""

    num_classes: int = 0
    label_smoothing: float = 0.0

    def predict(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs  # the logits: CandidateMetrics measures each head's accuracy and loss from them


def candidates_trainable(model: nn.Module, num_classes: int, label_smoothing: float, prepare) -> Trainable:
    """Each head trains as it would alone (the gradient of the sum of the heads' losses, plus each head's L2
    gradient), while the loss reported is the heads' mean cross-entropy; validation measures every head
    (CandidateMetrics) and reports, as accuracy and macro-F1, those of the head it would choose."""
    decays = model.weight_decays

    def loss_fn(logits, labels):
        k = logits.size(1)
        per_head = F.cross_entropy(logits.float().flatten(0, 1), labels.repeat_interleave(k),
                                   label_smoothing=label_smoothing, reduction="none").view(-1, k).mean(0)
        reported = per_head.mean()
        if not torch.is_grad_enabled():  # validation and test
            return reported
        objective = per_head.sum() + model.l2_penalty()
        return objective + (reported - objective).detach()  # the value reported, the gradient of the objective

    return CandidatesTrainable("text", model, loss_fn, lambda: CandidateMetrics(num_classes, decays), prepare,
                          primary_metric=primary(METRICS["text"]).name, conv=False, num_classes=num_classes,
                          label_smoothing=label_smoothing)


class CandidateMetrics:
    """Validation of a model with one head per candidate weight decay, with the interface of the torchmetrics the
    engine's evaluate uses (to, update, compute): each head's confusion counts (one-hot products: deterministic on
    every device) and summed cross-entropy, summed over ranks under DDP. compute gives every head's accuracy and
    loss (``accuracy_wd_<decay>``, ``loss_wd_<decay>``) and, for the head chosen (the lowest cross-entropy on the
    split), its ``weight_decay``, ``accuracy`` and ``macro_f1`` (the mean F1 of the classes that occur in its
    predictions or labels)."""

    def __init__(self, num_classes: int, decays: tuple[float, ...]):
        self.num_classes, self.decays = num_classes, tuple(decays)
        self.counts = torch.zeros(len(self.decays), num_classes, num_classes)  # (head, actual, predicted)
        self.losses = torch.zeros(len(self.decays))  # each head's summed cross-entropy

    def to(self, device: torch.device | str) -> CandidateMetrics:
        self.counts, self.losses = self.counts.to(device), self.losses.to(device)
        return self

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """`logits` (N, K, classes), as CandidatesTrainable.predict passes them."""
        actual = F.one_hot(labels, self.num_classes).float()
        predicted = F.one_hot(logits.argmax(-1), self.num_classes).float()
        self.counts += torch.einsum("na,nkp->kap", actual, predicted)
        picked = logits.float().log_softmax(-1).gather(-1, labels[:, None, None].expand(-1, logits.size(1), 1))
        self.losses -= picked.sum((0, 2))

    def compute(self) -> dict[str, torch.Tensor]:
        from trainlab.core import distributed

        counts = distributed.all_reduce_sum(self.counts.clone())
        losses = distributed.all_reduce_sum(self.losses.clone()) / counts.sum((1, 2)).clamp(min=1)
        hits = counts.diagonal(dim1=1, dim2=2)  # (head, class)
        accuracy = hits.sum(1) / counts.sum((1, 2)).clamp(min=1)
        occurring = counts.sum(1) + counts.sum(2)  # predicted + actual, per head and class
        f1 = (2 * hits / occurring.clamp(min=1)).sum(1) / (occurring > 0).sum(1).clamp(min=1)
        decays = torch.tensor(self.decays, device=counts.device)
        # the lowest loss, then the largest decay: accuracy differs between neighbouring candidates by a few texts
        # of the split, within its noise (on the tweets it chose 1e-6 by one text of 3,724, 0.3 points below the
        # lowest loss's test accuracy); the loss is continuous, a proper scoring rule, and what scikit-learn's
        # LogisticRegressionCV scores by default from 1.11
        best = torch.where(losses == losses.min(), decays, -1.0).argmax()
        return {"accuracy": accuracy[best], "macro_f1": f1[best], "weight_decay": decays[best],
                **{f"accuracy_wd_{d:g}": accuracy[i] for i, d in enumerate(self.decays)},
                **{f"loss_wd_{d:g}": losses[i] for i, d in enumerate(self.decays)}}


@torch.inference_mode()
def attention_maps(model: nn.Module, tokens: torch.Tensor, pad_id: int, device: torch.device) -> list[torch.Tensor]:
    """The last layer's attention, averaged over heads, for each text: (length, length) over its real tokens."""
    model.eval()
    _, attentions = model(tokens.to(device), return_attention=True)
    last = attentions[-1].float().mean(dim=1).cpu()  # (K, L, L)
    lengths = (tokens != pad_id).sum(dim=1).clamp(min=1).tolist()
    return [att[:n, :n] for att, n in zip(last, lengths)]


def decode_tokens(ids: torch.Tensor, vocab: list[str], pad_id: int) -> list[str]:
    """Token strings of one id sequence, [CLS] and [UNK] kept, padding dropped; hashed words read ``<oov:k>``."""
    from trainlab.data.tokenizer import token_name

    return [token_name(vocab, i) for i in ids.tolist() if i != pad_id]


@torch.inference_mode()
def top_ngrams(model: nn.Module, tokens: torch.Tensor, vocab: list[str], class_count: int,
               top: int = TOP_NGRAMS) -> list[list[tuple[str, float]]]:
    """Per class, the n-grams of `tokens` (test texts) that add most to that class's logit in an n-gram bag, with
    their weights. N-grams are named by their words; two n-grams sharing a hash bucket share a weight."""
    from trainlab.data.tokenizer import token_name
    from trainlab.models.ngram_bag import ngram_ids

    model = copy.deepcopy(model).float().cpu().eval()  # a copy: the caller's model keeps its device and dtype
    tokens = tokens.cpu()
    bag = ngram_ids(tokens, model.vocab_size, model.ngrams, model.buckets, model.pad_id)
    names: dict[int, str] = {}
    length = tokens.size(1)
    for row, bag_row in zip(tokens.tolist(), bag.tolist()):
        # bag_row holds the words, then the 2-grams from each position, then the 3-grams, ... (see ngram_ids)
        offset = 0
        for n in range(1, model.ngrams + 1):
            width = length - n + 1
            for i in range(max(width, 0)):
                bag_id = bag_row[offset + i]
                if bag_id != model.pad_id and bag_id not in names:
                    names[bag_id] = " ".join(token_name(vocab, t) for t in row[i:i + n])
            offset += max(width, 0)
    ids = torch.tensor(sorted(names), dtype=torch.long)
    if len(ids) == 0:
        return [[] for _ in range(class_count)]
    scores = model.ngram_scores(ids)  # (K, classes)
    # what sets a class apart: its score minus the mean over classes (a constant shift of all classes changes nothing)
    contrast = scores - scores.mean(dim=1, keepdim=True)
    out = []
    for c in range(class_count):
        values, order = contrast[:, c].topk(min(top, len(ids)))
        out.append([(names[int(ids[i])], round(float(v), 4)) for v, i in zip(values, order)])
    return out


def text_baseline(baseline_file: Path | None) -> dict:
    """The TF-IDF + logistic regression bar for the text model, on the same split: the text_baseline stage's
    baseline.json (fitted there, once per prepared data; training never fits it)."""
    from trainlab.data.baseline import read_baseline

    if baseline_file is None:
        raise ParamsError("training the text model needs the text_baseline stage's baseline.json: pass "
                          "--baseline models/text_baseline/baseline.json (as dvc.yaml does) after "
                          "`python -m stages.text_baseline data/prepared/text models/text_baseline`")
    return read_baseline(baseline_file)


class TextCode(TaskCode):
    spec_name = "text"
    params_type = TextParams
    builder = staticmethod(build_text_model)
    pictures = {"attention": "attention.png", "ngrams": "text_ngrams.png"}
    streamable = False  # the bags' statistics read the whole training split (token ids are small anyway)

    def sizes(self, meta: dict) -> dict[str, Any]:
        return {"vocab_size": meta["vocab_size"], "num_classes": meta["num_classes"],
                "max_length": meta["max_length"], "pad_id": meta.get("pad_id", 0)}

    def expected_config(self, meta: dict) -> dict[str, Any]:
        return {k: meta[k] for k in ("num_classes", "vocab_size", "max_length")}

    def make_trainable(self, model: nn.Module, meta: dict, cfg: TextParams | None = None) -> Trainable:
        return text_trainable(model, meta["num_classes"], cfg.label_smoothing if cfg is not None else 0.0)

    def config_fields(self, fields: dict) -> dict:
        if fields.get("arch") == "transformer_encoder":  # the config's name for text.arch transformer
            fields["arch"] = "transformer"
        # a saved TF-IDF bag holds the one head chosen; weight_decay auto would build a head per candidate
        return {"weight_decay": 0.0, **fields}

    def check_inputs(self, x: torch.Tensor, y: torch.Tensor, meta: dict, path: Path, meta_file: Path) -> None:
        if x.ndim != 2 or x.shape[1] > meta["max_length"]:
            raise DataError(f"{path}: tokens {tuple(x.shape)} do not fit max_length {meta['max_length']} "
                            f"of {meta_file}")
        low, high = int(x.min()), int(x.max())
        if low < 0 or high >= meta["vocab_size"]:
            raise DataError(f"{path}: token ids {low}..{high} outside the vocabulary of {meta['vocab_size']} in "
                            f"{meta_file}")

    def training_extras(self, params: Params, data_dir: Path, meta: dict, options: dict[str, Any]) -> TrainingExtras:
        baseline = text_baseline(options.get("baseline"))
        return TrainingExtras(files={"tokenizer.json": data_dir / "tokenizer.json"}, json={"baseline.json": baseline},
                              metrics={"baseline_test_accuracy": baseline["accuracy"],
                                       "baseline_test_macro_f1": baseline["macro_f1"]})

    def fit_statistics(self, model: nn.Module, train: dict[str, torch.Tensor], data_dir: Path | None) -> None:
        """The bags' own statistics (NB ratios, idf and character n-grams) from the training split and the prepared
        tokenizer's vocabulary; the Transformer has none."""
        fit = getattr(model, "fit_statistics", None)
        if fit is None:
            return
        from trainlab.data.tokenizer import Tokenizer

        vocab = Tokenizer.load(Path(data_dir) / "tokenizer.json").vocab if data_dir is not None else None
        fit(train["tokens"], train["labels"], vocab)

    def choose_model(self, task: Trainable, result: FitResult) -> tuple[Trainable, dict[str, Any]]:
        """A model with one head per candidate weight decay (text.weight_decay auto) is replaced in `result` by the
        head its last validation chose (CandidateMetrics), in the plain text task; what was chosen, with each
        candidate's validation accuracy and loss. Any other model is kept: an empty record."""
        from trainlab.models.init import count_parameters

        if not isinstance(task, CandidatesTrainable):
            return task, {}
        decays, last = result.model.weight_decays, result.history[-1]
        chosen = min(range(len(decays)), key=lambda i: abs(decays[i] - last["val_weight_decay"]))
        result.model = result.model.select_head(chosen)
        result.params_total, result.params_trainable = count_parameters(result.model)
        record = {"weight_decay": decays[chosen], "candidates": {
            f"{d:g}": {"val_accuracy": last[f"val_accuracy_wd_{d:g}"], "val_loss": last[f"val_loss_wd_{d:g}"]}
            for d in decays}}
        return text_trainable(result.model, task.num_classes, task.label_smoothing), record

    def tta(self, meta: dict) -> str:
        return "none"

    def load_extras(self, inputs: TaskInputs) -> dict[str, Any]:
        """The tokenizer vocabulary (checked against the model's copy) and the TF-IDF baseline's test results."""
        from trainlab.data.tokenizer import Tokenizer
        from trainlab.tasks.saved import read_json

        data_file, model_file = inputs.data_dir / "tokenizer.json", inputs.model_dir / "tokenizer.json"
        vocab = Tokenizer.load(data_file).vocab
        if model_file.is_file() and Tokenizer.load(model_file).vocab != vocab:
            raise CheckpointError(f"{model_file}: the model's vocabulary differs from {data_file}; the model was not "
                                  "trained on this data (rerun `dvc repro train_text`)")
        baseline_file = inputs.model_dir / "baseline.json"
        baseline = read_json(baseline_file)
        if not all(isinstance(baseline.get(k), (int, float)) for k in ("accuracy", "macro_f1")):
            raise CheckpointError(f"{baseline_file}: expected numbers 'accuracy' and 'macro_f1'")
        return {"vocab": vocab, "baseline": baseline}

    def evaluate(self, inputs: TaskInputs, runtime: Runtime, params: Params) -> TaskReport:
        from trainlab.tasks.scoring import FEW_EXAMPLES, evaluate_labels

        report, predicted = evaluate_labels(inputs, runtime, params)
        baseline = inputs.extra["baseline"]
        report.metrics["baseline_accuracy"] = round(float(baseline["accuracy"]), 6)
        report.metrics["baseline_macro_f1"] = round(float(baseline["macro_f1"]), 6)
        if baseline.get("confusion_matrix") is not None:
            report.confusion["baseline_matrix"] = baseline["confusion_matrix"]
        keep = min(FEW_EXAMPLES, params.evaluate.n_examples)
        tokens, pad_id = inputs.test["tokens"][:keep], inputs.config.get("pad_id", 0)
        names = report.confusion["labels"]
        # each model shows what it has: attention maps (Transformer) or its most weighted n-grams (n-gram bag); the
        # other picture says why it is empty, so that both declared outputs exist whatever text.arch is
        if inputs.config.get("arch") in NGRAM_ARCHS:
            no_attention = (f"The {inputs.config['arch']} model has no attention; its most weighted n-grams per "
                            "class are in text_ngrams.png.")
            report.pictures = {
                "ngrams": {"class_names": names, "ngrams": top_ngrams(inputs.model, inputs.test["tokens"],
                                                                      inputs.extra["vocab"], len(names))},
                "attention": {"tokens": [], "attentions": [], "empty": no_attention}}
            return report
        report.pictures = {"attention": {
            "tokens": [decode_tokens(t, inputs.extra["vocab"], pad_id) for t in tokens],
            "attentions": attention_maps(inputs.model, tokens, pad_id, runtime.device),
            "titles": [f"true {names[a]}, predicted {names[p]}"
                       for a, p in zip(inputs.test["labels"][:keep].tolist(), predicted[:keep].tolist())],
        }, "ngrams": {"class_names": names, "ngrams": [], "empty": "The Transformer has no n-gram weights; its "
                      "attention maps are in attention.png."}}
        return report


CODE = TextCode()
