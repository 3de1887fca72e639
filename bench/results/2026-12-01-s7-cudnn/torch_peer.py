# PyTorch eager FP32 (no TF32; cudnn.benchmark on) on the same GPU: median latency of resnet50 and
# mobilenet_v2 at batch 1 and 32, the peer for kiln bench.
import time
import torch
import torchvision

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = True
for name in ["resnet50", "mobilenet_v2"]:
    m = getattr(torchvision.models, name)().eval().cuda()
    for b in [1, 32]:
        x = torch.randn(b, 3, 224, 224, device="cuda")
        with torch.inference_mode():
            for _ in range(10):
                m(x)
            torch.cuda.synchronize()
            ts = []
            for _ in range(50):
                t = time.perf_counter()
                m(x)
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t)
        ts.sort()
        print(f"torch {torch.__version__} eager fp32 {name} batch {b}: median {ts[len(ts) // 2] * 1e3:.3f} ms", flush=True)
