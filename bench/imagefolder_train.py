"""A user's training script as many are written (bench/diagnose_bench.py runs it under sluice diagnose, unchanged):
ResNet-18 trained on an ImageFolder through a torch DataLoader, PIL decoding and torchvision's v2 transforms in the
workers.

    python3 bench/imagefolder_train.py IMAGEFOLDER [WORKERS] [STEPS]
"""
import sys

import torch
import torchvision
from torchvision.transforms import v2

folder, workers = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 200
tf = v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                 v2.ToDtype(torch.float32, scale=True), v2.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
dl = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(folder, transform=tf), batch_size=256, shuffle=True,
                                 num_workers=workers, pin_memory=True, drop_last=True)
model = torchvision.models.resnet18(num_classes=100).cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
n = 0
while n < steps:
    for x, y in dl:
        x = x.cuda(non_blocking=True).to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y.cuda(non_blocking=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        n += 1
        if n == steps:
            break
torch.cuda.synchronize()
