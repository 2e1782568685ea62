"""pytorchexample: A Flower / PyTorch app (Flower's quickstart-pytorch ``task.py``).

``Net``, ``train`` and ``test`` are the example's as Flower ships them. The loaders are a
stand-in: no network here, so instead of CIFAR-10 through ``flwr_datasets`` each node gets a
few of fedleak's bundled 32×32 photos (ten classes, like CIFAR-10), through the example's own
transforms and a ``DataLoader(batch_size, shuffle=True)`` as the example builds it.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Compose, Normalize, ToTensor

from fedleak.harness.zoo.bundled_images import photo_crops
from fedleak.harness.zoo.datasets import DatasetInfo, load_dataset


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz')"""

    def __init__(self):
        super(Net, self).__init__()  # noqa: UP008 (as Flower ships it)
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


pytorch_transforms = Compose([ToTensor(), Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])

# fedleak: what the audit may know of the data (shape, classes, the example's normalisation)
INFO = DatasetInfo("quickstart-photos", (3, 32, 32), 10, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5),
                   tuple(str(c) for c in range(10)))


class BundledPhotos(Dataset):
    """Stand-in for a CIFAR-10 partition: {"img", "label"} items through the transforms."""

    def __init__(self, images, labels):
        # uint8 HWC arrays, as a PIL/datasets image reaches ToTensor
        self.arrays = [(img.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
                       for img in images]
        self.labels = [int(y) for y in labels]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"img": pytorch_transforms(self.arrays[i]), "label": self.labels[i]}


def load_data(partition_id: int, num_partitions: int, batch_size: int, images: int = 2):
    """Node ``partition_id``'s first ``images`` bundled photos (of the train split's
    ``partition_id::num_partitions``) and the test split (stand-in for the CIFAR-10 loader).
    Where the 16 bundled photos do not suffice (e.g. 64 per node, as the quickstart's
    CIFAR-10 partitions hold hundreds), each node gets its own random crops of the same ten
    photographs (fedleak's ``photo_crops``, seeded by the partition)."""
    train = load_dataset("photos", "train")
    test = load_dataset("photos", "test")
    if images * num_partitions > len(train):
        crops, labels = photo_crops(images, seed=1000 + partition_id)
    else:
        chosen = torch.arange(partition_id, len(train), num_partitions)[:images]
        crops, labels = train.images[chosen], train.labels[chosen]
    trainloader = DataLoader(BundledPhotos(crops, labels), batch_size=batch_size, shuffle=True)
    testloader = DataLoader(BundledPhotos(test.images, test.labels), batch_size=batch_size)
    return trainloader, testloader


def public_photos():
    """fedleak: photos the server holds, like the nodes' (the bundled test split, on [0, 1]),
    for a malicious-server probe to calibrate its parameters on."""
    return load_dataset("photos", "test").images


def load_centralized_dataset():
    """Load test set and return dataloader."""
    test = load_dataset("photos", "test")
    return DataLoader(BundledPhotos(test.images, test.labels), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    avg_trainloss = running_loss / (epochs * len(trainloader))
    return avg_trainloss


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy
