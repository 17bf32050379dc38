"""Where the llama.cpp worker puts a workload's model: its RPC and GPU-like devices, registered
with ggml on first use and kept, and the target's and the draft's models loaded on them with the
workload's placement (``Placement``, a collaborator of ``llama_worker.Llama``)."""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..ggml.bindings import FakeGpuConfig, load_fake_gpu
from ..ggml.schedlog import SchedLog
from ..model.layout import BackendSpec
from ..model.llama_workload import CPU_DEVICE, Devices, LlamaWorkload

SPLIT_MODE = {"none": 0, "layer": 1, "row": 2, "tensor": 3}  # enum llama_split_mode
ALL_MEMORY = ctypes.c_size_t(-1).value  # schedfuzz_fake_gpu_set_free: all of the device's memory


class TensorBuftOverride(ctypes.Structure):
    """``struct llama_model_tensor_buft_override`` (llama.h), which llama-cpp-python does not bind."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class Placement:
    """The devices and the models on them, for one worker's libllama.

    ``L``: libllama (``declarations.Bindings``); ``glib``: libggml-base (ggml-python's); ``rpc``:
    libggml-rpc, None for a build without it; ``log``: the worker's scheduler log (what a failed
    load said); ``lines``: the worker's PLACEMENT log lines, which the log callback appends to
    (``Observation``): a model's loading empties it, and ``n_model_lines`` are the loading's."""

    def __init__(self, L: Any, glib: Any, rpc: ctypes.CDLL | None, log: SchedLog, lines: list[str]) -> None:
        self.L, self.glib, self.rpc, self.log, self.lines = L, glib, rpc, log, lines
        # libggml (the registry: ggml_backend_register, ggml_backend_dev_by_type)
        self.ggml = ctypes.CDLL(os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libggml.so"))
        self.ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        self.ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        self.ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
        self.ggml.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
        self.ggml.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
        self.cpu_dev = self.ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU: tensor overrides to the CPU, the GPU-like devices' kernels
        self.devices: dict[str, int] = {}  # endpoint -> ggml_backend_dev_t
        self.gpus: dict[str, int] = {}  # GPU-like device (index, settings) -> ggml_backend_dev_t
        self.fake: ctypes.CDLL | None = None
        self.model: Any = None
        self.model_key: tuple[Any, ...] | None = None
        self.draft_model: Any = None  # a draft model of its own (``DraftModel``), kept as the target's
        self.draft_model_key: tuple[Any, ...] | None = None
        self.n_model_lines = 0
        self._kept: dict[str, list[Any]] = {}  # per model slot: the arrays its load parameters point to

    def rpc_device(self, endpoint: str) -> int:
        if endpoint not in self.devices:
            assert self.rpc is not None, "an RPC device on a build without libggml-rpc (Llama.unsupported refuses it)"
            reg = self.rpc.ggml_backend_rpc_add_server(endpoint.encode())
            if not reg or not self.glib.ggml_backend_reg_dev_count(reg):
                raise ConnectionError(endpoint)
            self.devices[endpoint] = self.glib.ggml_backend_reg_dev_get(reg, 0)
        return self.devices[endpoint]

    def gpu_device(self, index: int, spec: BackendSpec) -> int:
        """GPU-like device ``GPU<index>`` with ``spec``'s settings (``ggml/fake_gpu.c``), registered
        with ggml's backend registry on first use (``ggml_backend_register``) and kept: ggml's
        registry cannot drop a device, so one per distinct setting lives as long as the worker, and
        the model is given its devices explicitly (``llama_model_params.devices``)."""
        key = json.dumps([index, spec.to_json()], sort_keys=True)
        if key not in self.gpus:
            if self.fake is None:
                self.fake = load_fake_gpu()
            reg = self.fake.schedfuzz_fake_gpu_register(f"GPU{index}".encode(), self.cpu_dev, ctypes.byref(FakeGpuConfig.of(spec)))
            if not reg:
                raise RuntimeError(f"schedfuzz_fake_gpu_register refused {spec.to_json()}")
            self.ggml.ggml_backend_register(ctypes.c_void_p(reg))
            self.gpus[key] = self.glib.ggml_backend_reg_dev_get(reg, 0)
        return self.gpus[key]

    def load_model(self, path: str, dv: Devices, endpoints: Sequence[str], mtp: bool = False) -> Any:
        """The model on ``dv``'s devices (kept while the next workload's placement is the same),
        each GPU-like device then left with ``dv.gpu_free`` bytes free for the contexts; with its
        MTP layers (``load_mtp``) where a draft context will run them, as llama-server loads it."""
        key = (path, tuple(endpoints[: dv.n_rpc]), replace(dv, gpu_free=()), mtp)
        if key != self.model_key:
            self.free_model()
            self.lines.clear()
            self.model = self._loaded("target", path, dv, dv, tuple(range(dv.n_devices)), endpoints, mtp)
            self.model_key, self.n_model_lines = key, len(self.lines)
        self._left_free(dv)
        return self.model

    def load_draft_model(self, path: str, w: LlamaWorkload, endpoints: Sequence[str]) -> Any:
        """The draft's model of its own (``DraftModel``: the target's file again, on its devices,
        with its MTP layers for draft-mtp), kept like the target's while its placement is the same."""
        assert w.draft_model is not None
        dv, chosen = w.draft_model.placement(w.devices)
        mtp = w.draft == "mtp"
        key = (path, tuple(endpoints[: dv.n_rpc]), replace(dv, gpu_free=()), chosen, mtp)
        if key != self.draft_model_key:
            self.free_draft_model()
            self.draft_model = self._loaded("draft", path, w.devices, dv, chosen, endpoints, mtp)
            self.draft_model_key = key
        self._left_free(w.devices)
        return self.draft_model

    def _loaded(self, slot: str, path: str, devices: Devices, dv: Devices, chosen: Sequence[int], endpoints: Sequence[str], mtp: bool) -> Any:
        """A model loaded with ``dv``'s placement on the ``chosen`` of ``devices``' devices (every
        GPU-like device with all its memory free for the weights)."""
        gpus = [self.gpu_device(k, g) for k, g in enumerate(devices.gpus)]
        for dev in gpus:
            self.fake.schedfuzz_fake_gpu_set_free(dev, ALL_MEMORY)  # for the weights
        devs = [self.rpc_device(e) for e in endpoints[: devices.n_rpc]] + gpus
        return self._load(slot, path, dv, [devs[i] for i in chosen], mtp)

    def _left_free(self, dv: Devices) -> None:
        """Each GPU-like device left with ``dv.gpu_free`` bytes free for the contexts."""
        for dev, free in zip([self.gpu_device(k, g) for k, g in enumerate(dv.gpus)], dv.gpu_free or [0] * len(dv.gpus)):
            self.fake.schedfuzz_fake_gpu_set_free(dev, free or ALL_MEMORY)

    def _load(self, slot: str, path: str, dv: Devices, devs: list[int], mtp: bool) -> Any:
        """``llama_model_load_from_file``; the arrays its parameters point to are kept per
        ``slot`` (the target's model, the draft's) while that model lives."""
        L = self.L
        keep: list[Any] = [(ctypes.c_void_p * (len(devs) + 1))(*devs, None)]
        mp = L.llama_model_default_params()
        if mtp:
            mp.load_mtp = True
        mp.devices = ctypes.cast(keep[0], ctypes.c_void_p)
        mp.n_gpu_layers = dv.n_gpu_layers
        mp.split_mode = SPLIT_MODE[dv.split_mode]
        mp.main_gpu = dv.main_gpu
        if dv.tensor_split:
            keep.append((ctypes.c_float * L.llama_max_devices())(*dv.tensor_split))
            mp.tensor_split = keep[-1]
        if dv.overrides:
            bufts = [self.ggml.ggml_backend_dev_buffer_type(ctypes.c_void_p(self.cpu_dev if d == CPU_DEVICE else devs[d])) for _, d in dv.overrides]
            patterns = [p.encode() for p, _ in dv.overrides]
            keep += [patterns, (TensorBuftOverride * (len(bufts) + 1))(*[TensorBuftOverride(p, b) for p, b in zip(patterns, bufts)])]
            mp.tensor_buft_overrides = ctypes.cast(keep[-1], ctypes.c_void_p)
        self._kept[slot] = keep
        model = L.llama_model_load_from_file(path.encode(), mp)
        if not model:
            raise RuntimeError(f"llama_model_load_from_file({path}) failed: {self.log.tail and list(self.log.tail)[-3:]}")
        return model

    def free_model(self) -> None:
        if self.model:
            self.L.llama_model_free(self.model)
        self.model, self.model_key = None, None

    def free_draft_model(self) -> None:
        if self.draft_model:
            self.L.llama_model_free(self.draft_model)
        self.draft_model, self.draft_model_key = None, None
