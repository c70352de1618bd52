"""Built-in workloads: a model, its dataset, its loss, and how a CPU batch becomes a device batch.

``build(spec)`` is the only entry point. It reads ``spec.workload`` (model, dataset, free-form config) and
``spec.hyperparameters.seed`` and returns a ``Workload``; the train loop never looks at model names. With
``spec.evaluation`` it also builds the evaluation set: a held-out split of the dataset (the training set is
then what is left), or ``evaluation.dataset`` read the same way as the training data; ``task`` tells the
evaluator which metrics the model's outputs give (``evaluation.py``).
User workloads (``spec.workload.entrypoint``) do not come through here: see ``user.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainop.api import model_config, trainingjob
from trainop_trainer import switches
from trainop_trainer.workloads import datasets, encoders, models

Batch = tuple[torch.Tensor, torch.Tensor]

_IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
_IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# Images reach the model in the job's low-precision dtype on GPUs: autocast (DDP) or FSDP's mixed-precision
# policy would cast them to it in the first layer anyway.
_INPUT_DTYPES = {trainingjob.Precision.BF16: torch.bfloat16, trainingjob.Precision.FP16: torch.float16}


CLASSIFICATION = "classification"
LANGUAGE_MODEL = "language_model"
MASKED_LM = "masked_lm"


@dataclasses.dataclass
class Workload:
    name: str
    model: nn.Module
    dataset: Dataset[Batch]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    # Moves a CPU batch to the device (non-blocking) and finishes preprocessing there.
    to_device: Callable[[Batch, torch.device], Batch]
    # Builds a dataset of the same form from another dataset spec (spec.evaluation.dataset).
    make_dataset: Callable[[trainingjob.Dataset], Dataset[Batch]]
    channels_last: bool = False
    # Names of the repeated blocks (transformer layers, residual blocks): the units FSDP shards, activation
    # checkpointing recomputes and compile compiles one by one (parallelize.py).
    blocks: tuple[str, ...] = ()
    # What the outputs are, for evaluation metrics: classification (logits per sample: accuracy, top-5),
    # language_model (logits per token: perplexity), masked_lm (logits per token, IGNORE_INDEX targets).
    task: str = CLASSIFICATION
    # The evaluation set (spec.evaluation); None without evaluation.
    eval_dataset: Dataset[Batch] | None = None


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, targets)


def language_model_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def plain_to_device(batch: Batch, device: torch.device) -> Batch:
    inputs, targets = batch
    return inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)


def normalise_images(
    images: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    *,
    memory_format: torch.memory_format,
    dtype: torch.dtype | None,
) -> torch.Tensor:
    """``(images - mean) / std`` in float32, in ``memory_format``, rounded once to ``dtype`` (None: float32).

    Two kernels: the subtraction promotes uint8 to float32 and writes the target layout, the division writes
    the target dtype."""
    device = images.device
    centred = torch.empty(images.shape, dtype=torch.float32, device=device, memory_format=memory_format)
    torch.sub(images, mean, out=centred)
    if dtype is None or dtype == torch.float32:
        return centred.div_(std)
    out = torch.empty(images.shape, dtype=dtype, device=device, memory_format=memory_format)
    return torch.div(centred, std, out=out)


def normalise_images_fused(
    images: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    *,
    memory_format: torch.memory_format,
    dtype: torch.dtype | None,
) -> torch.Tensor:
    """``images * scale + bias`` (``scale = 1/std``, ``bias = -mean/std``, see ``fused_stats``) in one kernel.

    Reads the uint8 batch once and writes the result once, in ``memory_format`` and ``dtype`` (None:
    float32), computing in float32: about a quarter of ``normalise_images``' memory traffic (no float32
    intermediate). Equal to ``(images - mean) / std`` up to float32 rounding (a few ulp), so after the
    rounding to bf16 practically always the same value."""
    out = torch.empty(
        images.shape, dtype=dtype or torch.float32, device=images.device, memory_format=memory_format
    )
    return torch.addcmul(bias, images, scale, out=out)


def fused_stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(1/std, -mean/std)`` of the ImageNet statistics, computed in float64 and stored as float32."""
    mean = torch.tensor(_IMAGENET_MEAN, dtype=torch.float64)
    std = torch.tensor(_IMAGENET_STD, dtype=torch.float64)
    scale, bias = (1.0 / std).float(), (-mean / std).float()
    return scale.view(1, 3, 1, 1).to(device), bias.view(1, 3, 1, 1).to(device)


class ImageToDevice:
    """uint8 NCHW -> normalised on the device, in channels_last when the model wants it.

    On CUDA the result is in ``dtype`` when given (the job's low-precision dtype, which the first layer
    would cast to anyway). ``switches`` ``input``: ``fused`` (default) one kernel
    (``normalise_images_fused``); ``lean`` two (``normalise_images``); ``f32`` the older four-kernel float32
    path, kept for comparison. On the CPU the input is float32 from ``normalise_images`` whatever the
    switch and precision (the bitwise-resume tests compare it; there is no copy to hide there)."""

    def __init__(self, *, channels_last: bool, dtype: torch.dtype | None = None) -> None:
        self.channels_last = channels_last
        self.dtype = dtype
        self._stats: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __call__(self, batch: Batch, device: torch.device) -> Batch:
        return self.finish(self.transfer(batch, device), device)

    def transfer(self, batch: Batch, device: torch.device) -> Batch:
        """The copy alone: the uint8 batch and its labels on ``device`` (``data.DeviceBatches`` runs it on
        its copy stream and, with ``switches`` ``normalise=step``, ``finish`` on the training stream)."""
        images, targets = batch
        return images.to(device, non_blocking=True), targets.to(device, non_blocking=True)

    def finish(self, batch: Batch, device: torch.device) -> Batch:
        """The normalisation of a batch ``transfer`` put on ``device``."""
        x, labels = batch
        if device not in self._stats:
            mean = torch.tensor(_IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
            std = torch.tensor(_IMAGENET_STD, device=device).view(1, 3, 1, 1)
            self._stats[device] = (mean, std, *fused_stats(device))
        mean, std, scale, bias = self._stats[device]
        mode = switches.input_mode()
        if mode == "f32":
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            return x.float().sub_(mean).div_(std), labels
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        if device.type != "cuda":
            return normalise_images(x, mean, std, memory_format=memory_format, dtype=None), labels
        if mode == "fused":
            return normalise_images_fused(
                x, scale, bias, memory_format=memory_format, dtype=self.dtype
            ), labels
        return normalise_images(x, mean, std, memory_format=memory_format, dtype=self.dtype), labels


def _check_fit(spec: trainingjob.TrainingJobSpec, ds: trainingjob.Dataset) -> None:
    """The API's refusal (``trainingjob.dataset_mismatch``), again where the dataset is opened."""
    mismatch = trainingjob.dataset_mismatch(spec.workload.model, ds.kind)
    if mismatch is not None:
        raise ValueError(f"spec.{mismatch}")


def _images(spec: trainingjob.TrainingJobSpec, seed: int, ds: trainingjob.Dataset) -> Dataset[Batch]:
    kind = ds.kind
    if kind == trainingjob.DatasetKind.SYNTHETIC:
        return datasets.SyntheticImages(
            num_samples=ds.num_samples, image_size=ds.image_size, num_classes=ds.num_classes, seed=seed
        )
    _check_fit(spec, ds)
    assert ds.path is not None  # the API requires a path for cifar10 and imagefolder
    if kind == trainingjob.DatasetKind.CIFAR10:
        return datasets.Cifar10(ds.path)
    return datasets.image_folder(ds.path, image_size=ds.image_size)


def _tokens(
    spec: trainingjob.TrainingJobSpec, seed: int, vocab_size: int, ds: trainingjob.Dataset
) -> datasets.BatchedDataset:
    if ds.kind == trainingjob.DatasetKind.SYNTHETIC:
        return datasets.SyntheticTokens(
            num_samples=ds.num_samples, sequence_length=ds.sequence_length, vocab_size=vocab_size, seed=seed
        )
    _check_fit(spec, ds)
    assert ds.path is not None  # the API requires a path for tokens
    return datasets.TokenFile(ds.path, sequence_length=ds.sequence_length, vocab_size=vocab_size)


def build(spec: trainingjob.TrainingJobSpec) -> Workload:
    """The built-in workload named by ``spec.workload.model`` (CPU, fp32; the trainer moves it), with its
    evaluation set when ``spec.evaluation`` is set."""
    workload = _build(spec)
    evaluation = spec.evaluation
    if evaluation is None:
        return workload
    if evaluation.dataset is not None:
        workload.eval_dataset = workload.make_dataset(evaluation.dataset)
    else:
        workload.dataset, workload.eval_dataset = datasets.holdout_split(
            workload.dataset, fraction=evaluation.holdout_fraction, seed=spec.hyperparameters.seed
        )
    return workload


def _build(spec: trainingjob.TrainingJobSpec) -> Workload:
    workload = spec.workload
    model_name = workload.model
    if model_name is None:
        raise ValueError("spec.workload.model is not set: user entrypoints are run by trainop_trainer.user")
    seed = spec.hyperparameters.seed
    ds = workload.dataset
    input_dtype = _INPUT_DTYPES.get(spec.precision)
    # Parameters are initialised from the job's seed, identically on every rank and every attempt.
    torch.manual_seed(seed)
    if model_name in (trainingjob.BuiltinModel.RESNET18, trainingjob.BuiltinModel.RESNET50):
        resnet_model = models.resnet(model_name.value, num_classes=ds.num_classes)
        return Workload(
            name=model_name.value,
            model=resnet_model,
            dataset=_images(spec, seed, ds),
            make_dataset=lambda d: _images(spec, seed, d),
            loss_fn=classification_loss,
            to_device=ImageToDevice(channels_last=True, dtype=input_dtype),
            channels_last=True,
            blocks=models.block_names(model_name.value, resnet_model),
        )
    if model_name == trainingjob.BuiltinModel.VIT_B16:
        vit = encoders.vit(image_size=ds.image_size, num_classes=ds.num_classes, config=workload.config)
        return Workload(
            name=model_name.value,
            model=vit,
            dataset=_images(spec, seed, ds),
            make_dataset=lambda d: _images(spec, seed, d),
            loss_fn=classification_loss,
            to_device=ImageToDevice(channels_last=False, dtype=input_dtype),
            blocks=encoders.block_names(vit),
        )
    if model_name == trainingjob.BuiltinModel.BERT_BASE:
        bert = encoders.bert(block_size=ds.sequence_length, config=workload.config)
        vocab_size = bert.config.vocab_size
        mask_id = model_config.Key.MASK_TOKEN_ID
        mask_token_id = model_config.dimension(workload.config, mask_id, vocab_size - 1)
        if mask_token_id >= vocab_size:
            raise ValueError(
                f"spec.workload.config.maskTokenId {mask_token_id} is outside the vocabulary of "
                f"{vocab_size}: choose an id below vocabSize"
            )

        def masked(d: trainingjob.Dataset) -> Dataset[Batch]:
            return datasets.MaskedTokens(
                _tokens(spec, seed, vocab_size, d),
                vocab_size=vocab_size,
                mask_token_id=mask_token_id,
                seed=seed,
                ignore_index=encoders.IGNORE_INDEX,
            )

        return Workload(
            name=model_name.value,
            model=bert,
            dataset=masked(ds),
            make_dataset=masked,
            loss_fn=encoders.masked_lm_loss,
            to_device=plain_to_device,
            blocks=encoders.block_names(bert),
            task=MASKED_LM,
        )
    if model_name.value in models.GPT_PRESETS:
        gpt = models.gpt(model_name.value, block_size=ds.sequence_length, config=workload.config)
        vocab = gpt.config.vocab_size
        return Workload(
            name=model_name.value,
            model=gpt,
            dataset=_tokens(spec, seed, vocab, ds),
            make_dataset=lambda d: _tokens(spec, seed, vocab, d),
            loss_fn=language_model_loss,
            to_device=plain_to_device,
            blocks=models.block_names(model_name.value, gpt),
            task=LANGUAGE_MODEL,
        )
    if ds.kind == trainingjob.DatasetKind.DIGITS:
        return _digits_mlp(spec, ds)
    _check_fit(spec, ds)
    mlp = models.mlp(num_classes=ds.num_classes, config=workload.config)
    input_dim = mlp.input_dim

    def vectors(d: trainingjob.Dataset) -> Dataset[Batch]:
        # The same seed: the same teacher, so a separate synthetic set asks the same question.
        return datasets.SyntheticVectors(
            num_samples=d.num_samples, input_dim=input_dim, num_classes=ds.num_classes, seed=seed
        )

    return Workload(
        name=model_name.value,
        model=mlp,
        dataset=vectors(ds),
        make_dataset=vectors,
        loss_fn=classification_loss,
        to_device=plain_to_device,
        blocks=models.block_names(model_name.value, mlp),
    )


def _digits_mlp(spec: trainingjob.TrainingJobSpec, ds: trainingjob.Dataset) -> Workload:
    """The mlp on scikit-learn's digits: 64 inputs, 10 classes, whatever inputDim/numClasses say."""
    if "num_classes" in ds.model_fields_set and ds.num_classes != datasets.Digits.NUM_CLASSES:
        raise ValueError(
            f"spec.workload.dataset.numClasses {ds.num_classes} does not fit kind digits, which has 10 "
            "classes: set numClasses to 10 or leave it out"
        )
    config = {**spec.workload.config, model_config.Key.INPUT_DIM.value: datasets.Digits.NUM_FEATURES}
    mlp = models.mlp(num_classes=datasets.Digits.NUM_CLASSES, config=config)

    def digits(d: trainingjob.Dataset) -> Dataset[Batch]:
        if d.kind != trainingjob.DatasetKind.DIGITS:
            raise ValueError("spec.evaluation.dataset: the mlp trained on digits evaluates on kind digits")
        return datasets.Digits()

    return Workload(
        name="mlp",
        model=mlp,
        dataset=datasets.Digits(),
        make_dataset=digits,
        loss_fn=classification_loss,
        to_device=plain_to_device,
        blocks=models.block_names("mlp", mlp),
    )
