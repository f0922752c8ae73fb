"""Models as they come: keyword inputs, clips in (B, T, C, H, W), layer discovery, target lists,
several inputs at once.

Small random-weight models stand in for a CLIP-like tower, a VideoMAE-style clip model and a
1-channel CNN; nothing is downloaded.

    python examples/any_model.py
"""

import torch
from torch import nn

import camkit
from camkit.targets import ClassTarget, SoftmaxTarget

torch.manual_seed(0)


class TextAndImage(nn.Module):
    """CLIP-like: the first positional argument is the text, the image a keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.words = nn.Embedding(10, 8)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> dict:
        image = self.conv(pixel_values).mean(dim=(2, 3))
        return {"logits_per_image": image @ self.words(input_ids).T}


# 1. a keyword input, the other inputs by keyword; one text per image (target = sample index)
clip = TextAndImage().eval()
images, texts = torch.rand(2, 3, 32, 32), torch.tensor([3, 7])
cam = camkit.GradCAM(camkit.KeywordInput(clip, "pixel_values"), "conv", output="logits_per_image")
heat = cam(images, target=[0, 1], additional_forward_args={"input_ids": texts})
print("keyword input:", tuple(heat.shape))  # (2, 32, 32)


# 2. a clip model taking (B, T, C, H, W): declared, so time is never read from the channels
class ClipModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tubelets = nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4))
        self.head = nn.Linear(8, 5)

    def forward(self, clip: torch.Tensor) -> torch.Tensor:  # (B, T, C, H, W)
        return self.head(self.tubelets(clip.permute(0, 2, 1, 3, 4)).mean(dim=(2, 3, 4)))


video = torch.rand(1, 8, 3, 32, 32)  # (B, T, C, H, W)
declared = camkit.InputLayout(ClipModel().eval(), "BTCHW")
maps = camkit.GradCAM(declared, "tubelets")(video.transpose(1, 2), target=2)
print("clip (B, T, H, W):", tuple(maps.shape))  # (1, 8, 32, 32)

# 3. discovery from the input the model takes: a 1-channel CNN
gray = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
).eval()  # fmt: skip
scan = torch.rand(1, 1, 64, 64)
layer = camkit.models.default_layer(gray, example=scan)
print("default layer:", layer, "| skipped:", camkit.models.skipped_layers(gray, example=scan))

# 4. one target object per sample, or K per sample
two = torch.rand(2, 1, 64, 64)
one_each = camkit.GradCAM(gray, layer)(two, target=[ClassTarget(1), SoftmaxTarget(3)])
k_each = camkit.GradCAM(gray, layer)(two, target=[[ClassTarget(0), ClassTarget(1)]] * 2)
print("target lists:", tuple(one_each.shape), tuple(k_each.shape))  # (2, 64, 64) (2, 2, 64, 64)


# 5. several inputs at once (captum's tuples): an image and its metadata vector
class ImageAndMetadata(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 + 4, 5)

    def forward(self, image: torch.Tensor, metadata: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.conv(image).relu().mean(dim=(2, 3)), metadata], 1))


both = ImageAndMetadata().eval()
image, metadata = torch.rand(2, 3, 32, 32), torch.rand(2, 4)
pixels, fields = camkit.IntegratedGradients(both)((image, metadata), target=1)
print("tuple of inputs:", tuple(pixels.shape), tuple(fields.shape))  # (2, 3, 32, 32) (2, 4)
