"""sluice diagnose on the GPU machine (issue #52): ResNet-50, a DataLoader of 16 workers decoding JPEGs with PIL, 50 steps, one
epoch, run under `sluice diagnose`. The verdict must describe the steady state (not startup-bound: one epoch)."""
import io, sys, time
import numpy as np, torch, torchvision
from PIL import Image

N, B = 50 * 64, 64
rng = np.random.default_rng(0)
jpgs = []
for i in range(256):
    a = rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)
    buf = io.BytesIO(); Image.fromarray(a).save(buf, "JPEG", quality=90); jpgs.append(buf.getvalue())
tf = torchvision.transforms.Compose([torchvision.transforms.RandomResizedCrop(224), torchvision.transforms.ToTensor()])

class DS(torch.utils.data.Dataset):
    def __len__(self): return N
    def __getitem__(self, i):
        return tf(Image.open(io.BytesIO(jpgs[i % len(jpgs)])).convert("RGB")), i % 1000

if __name__ == "__main__":
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    dl = torch.utils.data.DataLoader(DS(), batch_size=B, num_workers=workers, pin_memory=True)
    m = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    t = time.perf_counter()
    for x, y in dl:
        x = x.cuda(non_blocking=True).to(memory_format=torch.channels_last); y = y.cuda(non_blocking=True)
        with torch.autocast("cuda", torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
    print(f"trained {N // B} steps in {time.perf_counter() - t:.1f} s with {workers} workers")
