#!/usr/bin/env python3
"""The model zoo a new user tries, run on the GPU host after scripts/gpu.sh built build-gpu.

Exports real architectures (torchvision CNNs, ViT/Swin/MaxViT, segmentation nets, BERT-base,
DistilBERT, GPT-2, T5-small encoder, Whisper-tiny encoder, CLIP vision tower) with seeded random
weights (nothing is downloaded) through torch.onnx.export, with the dynamo exporter and the
TorchScript exporter where each works: dynamic batch, dynamic H/W for the segmentation models,
dynamic sequence length for text. ONNX Runtime (CPU, FP32) computes the reference outputs at two
shapes inside the profile. Each model is then built with the kiln CLI on the CPU (FP32) and on
CUDA (strict FP32, TF32, FP16), run at both shapes, and compared with the reference:
  strict FP32: |kiln - ref| <= 1e-4 + 1e-3*|ref| everywhere, or, where the reference is
               ill-conditioned (that bound fails), cosine >= 0.99999 (marked "cos");
  TF32, FP16:  cosine >= 0.999 per output, or, where PyTorch's own TF32/FP16 on the GPU stays under
               0.999 on the same weights (ill-conditioned in that precision), no lower than PyTorch's
               (marked "peer");
  always:      output shapes exactly the reference's.
Writes docs/zoo.md (--doc) and prints one line per model, exporter, device and precision.

  python3 scripts/zoo.py [--phase export|run|all] [--models a,b] [--exporters dynamo,torchscript]
                         [--configs cpu-fp32,cuda-fp32,cuda-tf32,cuda-fp16] [--jobs N] [--results R.json]
  python3 scripts/zoo.py --merge R1.json R2.json ...   (docs/zoo.md from model groups run apart)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMG = dict(kind="image", min=(1, 3, 224, 224), opt=(2, 3, 224, 224), max=(8, 3, 224, 224),
           shapes=[(1, 3, 224, 224), (3, 3, 224, 224)])
SEG = dict(kind="image", min=(1, 3, 192, 192), opt=(2, 3, 256, 256), max=(4, 3, 384, 384),
           shapes=[(1, 3, 224, 224), (2, 3, 256, 320)], hw=True)
TXT = dict(kind="tokens", min=(1, 8), opt=(2, 64), max=(8, 128), shapes=[(1, 16), (3, 64)])

# name: (how to make it, input spec)
MODELS = {}


def tv(name, spec=IMG, **kw):
    MODELS[name] = (("torchvision", name, kw), spec)


for _n in ["resnet50", "resnext50_32x4d", "wide_resnet50_2", "densenet121", "googlenet", "mobilenet_v2",
           "mobilenet_v3_large", "efficientnet_b0", "efficientnet_v2_s", "regnet_y_400mf", "mnasnet1_0",
           "shufflenet_v2_x1_0", "squeezenet1_1", "convnext_tiny", "swin_t", "vit_b_16", "maxvit_t"]:
    tv(_n)
# Swin-V2's window size (8) divides its 256-pixel training size: the shapes stay at 256.
tv("swin_v2_t", dict(IMG, min=(1, 3, 256, 256), opt=(2, 3, 256, 256), max=(8, 3, 256, 256),
                     shapes=[(1, 3, 256, 256), (3, 3, 256, 256)]))
tv("inception_v3", dict(IMG, min=(1, 3, 299, 299), opt=(2, 3, 299, 299), max=(8, 3, 299, 299),
                        shapes=[(1, 3, 299, 299), (3, 3, 299, 299)]), aux_logits=False, init_weights=True)
for _n in ["deeplabv3_mobilenet_v3_large", "fcn_resnet50", "lraspp_mobilenet_v3_large"]:
    MODELS[_n] = (("segmentation", _n, {}), SEG)
MODELS["bert_base"] = (("hf", "bert", {}), TXT)
MODELS["distilbert"] = (("hf", "distilbert", {}), TXT)
MODELS["gpt2"] = (("hf", "gpt2", {}), TXT)
MODELS["t5_small_encoder"] = (("hf", "t5", {}), TXT)
MODELS["whisper_tiny_encoder"] = (("hf", "whisper", {}), dict(kind="audio", min=(1, 80, 3000), opt=(2, 80, 3000),
                                                              max=(4, 80, 3000), shapes=[(1, 80, 3000), (2, 80, 3000)]))
MODELS["clip_vision"] = (("hf", "clip", {}), IMG)
MODELS["llama"] = (("hf", "llama", {}), TXT)


def realistic(model, example):
    """Seeded weights that keep activations near unit scale, as trained ones do: torchvision's
    fresh init zeroes some heads (ViT, GoogLeNet) and leaves others' logits near 1e-9
    (MobileNetV3, EfficientNet), which no comparison can judge, while redrawn weights alone make
    squeeze-excitation networks chaotic (outputs of 1e7). So: linear weights ~ N(0, 1/fan_in),
    norm scales near 1 and shifts near 0, then every BatchNorm's running statistics recalibrated on
    the example batch (the cumulative average of one training-mode pass), so each normalizes its
    input as it would in a trained network."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.in_features ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
            elif isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)):
                if getattr(m, "weight", None) is not None:
                    m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=g))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.reset_running_stats()
                    m.momentum = None
        model.train()
        model(example)
    return model.eval()


def make_model(how, spec):
    import torch
    import torchvision

    source, name, kw = how
    calib = torch.from_numpy(sample(spec, (8,) + tuple(spec["opt"][1:]), 7))
    torch.manual_seed(0)

    class First(torch.nn.Module):  # one tensor out: dict "out" (segmentation), or the first output
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            r = self.m(x)
            if hasattr(r, "last_hidden_state"):  # transformers' ModelOutput (a dict too)
                return r.last_hidden_state
            if isinstance(r, dict):
                return r["out"]
            if isinstance(r, (tuple, list)):
                return r[0]
            return r.last_hidden_state if hasattr(r, "last_hidden_state") else r

    if source == "torchvision":
        return realistic(getattr(torchvision.models, name)(weights=None, **kw), calib)
    if source == "segmentation":
        m = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None)
        return First(realistic(m, calib)).eval()
    import transformers as tf

    if name == "bert":
        m = tf.BertModel(tf.BertConfig())
    elif name == "distilbert":
        m = tf.DistilBertModel(tf.DistilBertConfig())
    elif name == "gpt2":
        m = tf.GPT2Model(tf.GPT2Config(use_cache=False))
    elif name == "t5":
        m = tf.T5EncoderModel(tf.T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64, vocab_size=32128))
    elif name == "whisper":
        m = tf.WhisperModel(tf.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6,
                                             decoder_layers=4, decoder_attention_heads=6, encoder_ffn_dim=1536,
                                             decoder_ffn_dim=1536, num_mel_bins=80)).get_encoder()
    elif name == "llama":
        # A Llama-style decoder of realistic width, few layers: RMSNorm, rotary embeddings, grouped-query
        # attention (16 query heads over 4 key/value heads of 64), SwiGLU MLP.
        m = tf.LlamaModel(tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                         num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                         max_position_embeddings=2048, use_cache=False))
    elif name == "clip":
        m = tf.CLIPVisionModel(tf.CLIPVisionConfig())
    else:
        raise ValueError(name)
    return First(m.eval()).eval()


def sample(spec, shape, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    if spec["kind"] == "tokens":
        return rng.integers(0, 1000, size=shape, dtype=np.int64)
    return rng.standard_normal(shape).astype(np.float32)


def export_one(args):
    """Exports one (model, exporter), runs ONNX Runtime on both test inputs, writes meta.json."""
    name, exporter, out_dir = args
    import numpy as np
    import torch

    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")
    how, spec = MODELS[name]
    base = os.path.join(out_dir, f"{name}.{exporter}")
    meta = dict(model=name, exporter=exporter, ok=False)
    t0 = time.time()
    try:
        model = make_model(how, spec)
        input_name = "input_ids" if spec["kind"] == "tokens" else ("input_features" if spec["kind"] == "audio" else "x")
        example = torch.from_numpy(sample(spec, spec["opt"], 0))
        dims = {0: "batch"}
        if spec["kind"] == "tokens":
            dims[1] = "seq"
        if spec.get("hw"):
            dims[2], dims[3] = "h", "w"
        if exporter == "dynamo":
            batch = torch.export.Dim("batch", min=1, max=spec["max"][0])
            ds = {0: batch}
            if spec["kind"] == "tokens":
                ds[1] = torch.export.Dim("seq", min=spec["min"][1], max=spec["max"][1])
            if spec.get("hw"):
                ds[2] = 8 * torch.export.Dim("h8", min=spec["min"][2] // 8, max=spec["max"][2] // 8)
                ds[3] = 8 * torch.export.Dim("w8", min=spec["min"][3] // 8, max=spec["max"][3] // 8)
            torch.onnx.export(model, (example,), base + ".onnx", dynamo=True, opset_version=18,
                              input_names=[input_name], dynamic_shapes=(ds,), verbose=False)
        else:
            torch.onnx.export(model, (example,), base + ".onnx", dynamo=False, opset_version=17,
                              input_names=[input_name], output_names=["out"], dynamic_axes={input_name: dims})
        meta["export_s"] = round(time.time() - t0, 1)
        import onnx
        import onnxruntime as ort

        m = onnx.load(base + ".onnx", load_external_data=False)
        meta["nodes"] = len(m.graph.node)
        meta["ops"] = sorted({n.op_type for n in m.graph.node})
        meta["input"] = m.graph.input[0].name
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        sess = ort.InferenceSession(base + ".onnx", so, providers=["CPUExecutionProvider"])
        meta["outputs"] = [o.name for o in sess.get_outputs()]
        meta["sets"] = []
        for k, shape in enumerate(spec["shapes"]):
            x = sample(spec, shape, 1 + k)
            np.save(f"{base}.in{k}.npy", x)
            for o, y in zip(meta["outputs"], sess.run(None, {meta["input"]: x})):
                np.save(f"{base}.ref{k}.{file_stem(o)}.npy", y)
            meta["sets"].append(list(shape))
        meta["torch_cosine"] = torch_peer_cosines(model, spec, base, meta)
        meta["ok"] = True
    except Exception as e:  # recorded: one exporter's failure is a row of the table, not the end
        lines = [l for l in str(e).strip().splitlines() if l.strip()]
        meta["error"] = f"{type(e).__name__}: {lines[0][:240] if lines else ''}"
    with open(base + ".meta.json", "w") as f:
        json.dump(meta, f)
    return meta


def cosine(got, ref):
    import numpy as np

    got, ref = np.asarray(got, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    denom = np.linalg.norm(got) * np.linalg.norm(ref)
    return float(np.dot(got, ref) / denom) if denom > 0 else float(np.array_equal(got, ref))


def torch_peer_cosines(model, spec, base, meta):
    """PyTorch's own reduced-precision error on the GPU, as context for kiln's TF32 and FP16 cells:
    the worst cosine against the same ONNX Runtime reference of the model run with TF32 matmuls and
    convolutions, and under torch.autocast(float16). None without a GPU."""
    import numpy as np
    import torch

    if not torch.cuda.is_available():
        return None
    model = model.cuda()
    worst = dict(tf32=1.0, fp16=1.0)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        for k in range(len(meta["sets"])):
            x = torch.from_numpy(np.load(f"{base}.in{k}.npy")).cuda()
            ref = np.load(f"{base}.ref{k}.{file_stem(meta['outputs'][0])}.npy")
            with torch.no_grad():
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
                worst["tf32"] = min(worst["tf32"], cosine(model(x).float().cpu().numpy(), ref))
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
                with torch.autocast("cuda", dtype=torch.float16):
                    worst["fp16"] = min(worst["fp16"], cosine(model(x).float().cpu().numpy(), ref))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
        model.cpu()
    return worst


def file_stem(name):  # as the kiln CLI names an output's .npy (tools/kiln/run_cmd.cc)
    s = re.sub(r"[/\\: ]", "_", name)
    return "output" if s in ("", ".", "..") else s


def spec_arg(shape):
    return "x".join(str(d) for d in shape)


def run_one(args):
    """Builds one (model, exporter) for one config with the kiln CLI, runs both sets, compares."""
    meta, config, out_dir, kiln = args
    import numpy as np

    device, prec = config.split("-")
    _, spec = MODELS[meta["model"]]
    base = os.path.join(out_dir, f"{meta['model']}.{meta['exporter']}")
    engine = f"{base}.{config}.kiln"
    inp = meta["input"]
    flags = [f"--device={device}", f"--minShapes={inp}:{spec_arg(spec['min'])}",
             f"--optShapes={inp}:{spec_arg(spec['opt'])}", f"--maxShapes={inp}:{spec_arg(spec['max'])}"]
    flags += {"fp32": ["--noTF32"], "tf32": [], "fp16": ["--fp16"]}[prec]
    row = dict(model=meta["model"], exporter=meta["exporter"], config=config, ok=False)
    t0 = time.time()
    b = subprocess.run([kiln, "build", f"--onnx={base}.onnx", f"--saveEngine={engine}"] + flags,
                       capture_output=True, text=True, timeout=900)
    row["build_s"] = round(time.time() - t0, 1)
    if b.returncode != 0:
        err = (b.stderr or b.stdout).strip().splitlines()
        row["error"] = "build: " + (" ".join(err[:3])[:300] if err else f"exit {b.returncode}")
        return row
    worst = dict(max_abs=0.0, max_rel=0.0, cosine=1.0)
    verdict, how = True, "bound"
    for k in range(len(meta["sets"])):
        out = f"{base}.{config}.out{k}"
        r = subprocess.run([kiln, "run", f"--loadEngine={engine}", f"--loadInputs={inp}:{base}.in{k}.npy",
                            f"--exportOutput={out}"], capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            err = (r.stderr or r.stdout).strip().splitlines()
            row["error"] = f"run set {k}: " + (" ".join(err[:3])[:300] if err else f"exit {r.returncode}")
            return row
        for o in meta["outputs"]:
            ref = np.load(f"{base}.ref{k}.{file_stem(o)}.npy").astype(np.float64)
            path = os.path.join(out, file_stem(o) + ".npy")
            if not os.path.exists(path):
                row["error"] = f"set {k}: no output {o}"
                return row
            got = np.load(path).astype(np.float64)
            if got.shape != ref.shape:
                row["error"] = f"set {k}: output {o} has shape {got.shape}, the reference {ref.shape}"
                return row
            diff = np.abs(got - ref)
            max_abs = float(diff.max()) if diff.size else 0.0
            max_rel = float((diff / np.maximum(np.abs(ref), 1e-12)).max()) if diff.size else 0.0
            cos = cosine(got, ref)
            worst["max_abs"] = max(worst["max_abs"], max_abs)
            worst["max_rel"] = max(worst["max_rel"], max_rel)
            worst["cosine"] = min(worst["cosine"], cos)
            if prec == "fp32":
                if not np.all(diff <= 1e-4 + 1e-3 * np.abs(ref)):
                    how = "cos"
                    verdict &= cos >= 0.99999
            else:
                how = "cos"
                verdict &= cos >= 0.999
    # An ill-conditioned model in reduced precision: where PyTorch's own TF32/FP16 on the GPU stays
    # under 0.999 on the same weights and inputs, no engine computing in that precision can be held
    # to 0.999; kiln passes there at a cosine no lower than PyTorch's (marked "peer").
    peer = (meta.get("torch_cosine") or {}).get(prec)
    if prec != "fp32" and not verdict and peer is not None and peer < 0.999 and worst["cosine"] >= peer:
        verdict, how = True, "peer"
    row.update(worst, ok=bool(verdict), criterion=how)
    for f in os.listdir(out_dir):  # engines are large: keep the disk free
        if f.startswith(os.path.basename(engine)):
            p = os.path.join(out_dir, f)
            if os.path.isfile(p):
                os.remove(p)
    return row


def gpu_name():
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip().splitlines()
    except OSError:
        gpu = []
    return gpu[0] if gpu else "a machine without a GPU"


def write_doc(path, metas, rows, configs, gpu, command):
    by = {(r["model"], r["exporter"], r["config"]): r for r in rows}
    lines = ["# Model zoo", "",
             f"Generated by `{command}` on {gpu}, "
             f"{time.strftime('%Y-%m-%d')}; do not edit. Seeded random weights (norm and linear layers re-drawn so "
             "activations stay near unit scale), exported by torch.onnx.export; reference: ONNX Runtime CPU FP32 at two "
             "shapes inside the profile. Each cell: pass/FAIL, worst max abs error, worst cosine over both shapes and "
             "all outputs, build seconds. Strict FP32 passes on |kiln - ref| <= 1e-4 + 1e-3*|ref| everywhere, or "
             "(marked `cos`, an ill-conditioned reference) cosine >= 0.99999; TF32 and FP16 on cosine >= 0.999, or (marked "
             "`peer`, a model ill-conditioned in that precision: PyTorch's own TF32 or FP16 on the GPU stays under 0.999 "
             "on the same weights and inputs) on a cosine no lower than PyTorch's. "
             "Output shapes must equal the reference's. "
             "In brackets after a TF32 or FP16 cell: PyTorch's own worst cosine on the GPU against the same reference "
             "(TF32 matmuls and convolutions; torch.autocast float16), for context.", "",
             "| model | exporter | nodes / ops | " + " | ".join(configs) + " |",
             "|---|---|---|" + "---|" * len(configs)]
    for m in metas:
        cells = []
        for c in configs:
            r = by.get((m["model"], m["exporter"], c))
            if not m["ok"]:
                cells.append("-")
            elif r is None:
                cells.append("not run")
            elif "error" in r:
                cells.append("**FAIL** " + r["error"].replace("|", "/")[:160])
            else:
                tag = "pass" if r["ok"] else "**FAIL**"
                crit = (" cos" if r.get("criterion") == "cos" and c.endswith("fp32")
                        else " peer" if r.get("criterion") == "peer" else "")
                peer = (m.get("torch_cosine") or {}).get(c.split("-")[-1])
                peer = f" (torch {peer:.6f})" if peer is not None else ""
                cells.append(f"{tag}{crit} {r['max_abs']:.2e} / {r['cosine']:.6f}{peer} / {r['build_s']}s")
        what = f"{m['nodes']} / {len(m['ops'])}" if m["ok"] else "export failed: " + m.get("error", "")[:160].replace("|", "/")
        lines.append(f"| {m['model']} | {m['exporter']} | {what} | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "build-gpu", "zoo"))
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build-gpu", "tools", "kiln", "kiln"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "zoo.md"))
    ap.add_argument("--phase", default="all", choices=["export", "run", "all"])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--exporters", default="dynamo,torchscript")
    ap.add_argument("--configs", default="cpu-fp32,cuda-fp32,cuda-tf32,cuda-fp16")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--results", help="also write this run's exports and rows as JSON (for --merge)")
    ap.add_argument("--merge", nargs="+", metavar="RESULTS",
                    help="write --doc from the --results files of several runs (model groups run apart), no GPU")
    a = ap.parse_args()
    if a.merge:
        metas, rows, gpus, configs = [], [], set(), []
        for path in a.merge:
            with open(path) as f:
                r = json.load(f)
            metas += r["metas"]
            rows += r["rows"]
            gpus.add(r["gpu"])
            configs += [c for c in r["configs"] if c not in configs]
        order = {n: i for i, n in enumerate(MODELS)}
        metas.sort(key=lambda m: (order.get(m["model"], len(order)), m["exporter"]))
        write_doc(a.doc, metas, rows, configs, " and ".join(sorted(gpus)),
                  f"scripts/zoo.py --models ... --results R (one run per model group), then --merge R...")
        bad = [r for r in rows if not r["ok"]]
        print(f"zoo: {len(rows) - len(bad)} of {len(rows)} builds pass; {sum(not m['ok'] for m in metas)} exports failed")
        return
    os.makedirs(a.out, exist_ok=True)
    names = [n for n in a.models.split(",") if n]
    for n in names:
        if n not in MODELS:
            sys.exit(f"zoo: unknown model {n}; known: {', '.join(MODELS)}")
    pairs = [(n, e) for n in names for e in a.exporters.split(",")]
    if a.phase in ("export", "all"):
        todo = [(n, e, a.out) for n, e in pairs if not os.path.exists(os.path.join(a.out, f"{n}.{e}.meta.json"))]
        with ProcessPoolExecutor(max_workers=a.jobs) as pool:
            for meta in pool.map(export_one, todo):
                print(f"export {meta['model']:<30} {meta['exporter']:<11} "
                      + ("ok" if meta["ok"] else "FAILED " + meta.get("error", "")), flush=True)
    if a.phase == "export":
        return
    metas = []
    for n, e in pairs:
        p = os.path.join(a.out, f"{n}.{e}.meta.json")
        if os.path.exists(p):
            with open(p) as f:
                metas.append(json.load(f))
    configs = a.configs.split(",")
    jobs = [(m, c, a.out, a.kiln) for m in metas if m["ok"] for c in configs]
    rows = []
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for r in pool.map(run_one, jobs):
            rows.append(r)
            status = ("pass" if r["ok"] else "FAIL") if "error" not in r else "FAIL " + r["error"]
            detail = f" max_abs {r['max_abs']:.2e} cosine {r['cosine']:.6f}" if "max_abs" in r else ""
            print(f"{r['model']:<30} {r['exporter']:<11} {r['config']:<9} {status}{detail} build {r['build_s']}s",
                  flush=True)
    write_doc(a.doc, metas, rows, configs, gpu_name(), "scripts/zoo.py")
    if a.results:
        with open(a.results, "w") as f:
            json.dump(dict(gpu=gpu_name(), configs=configs, metas=metas, rows=rows), f)
    bad = [r for r in rows if not r["ok"]]
    print(f"zoo: {len(rows) - len(bad)} of {len(rows)} builds pass; {sum(not m['ok'] for m in metas)} exports failed")


if __name__ == "__main__":
    main()
