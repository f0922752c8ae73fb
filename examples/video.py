"""Where and when in a clip: Grad-CAM on a video transformer and a 3-D CNN, the per-frame
importance, the drop in score when a frame is removed, an animated overlay; then Score-CAM on a
frame-wise model, concepts on the 3-D CNN and Grad-CAM on X-CLIP's prompts.

Tiny models with random weights (a VideoMAE built from a transformers config, torchvision's
r3d_18): the maps show the mechanics, not what a trained model looks at. A clip is ``(B, C, T,
H, W)``; HuggingFace video models take ``(B, T, C, H, W)``, declared with ``InputLayout``.
Nothing is downloaded.

    python examples/video.py    # writes video_overlay.gif, video_overlay.mp4, video_frames.png
"""

import numpy as np
import torch
from torchvision.models.video import r3d_18
from transformers import (
    VideoMAEConfig,
    VideoMAEForVideoClassification,
    XCLIPConfig,
    XCLIPModel,
)

import camkit
from camkit import metrics, models
from camkit.io import video
from camkit.methods.concepts import ConceptAttribution
from camkit.viz.video import importance_plot, overlay_frames

torch.manual_seed(0)
clip = torch.rand(1, 3, 8, 64, 64)  # (B, C, T, H, W)

# a video transformer: tubelet tokens (2 frames x 16 x 16 pixels), laid out from the model
config = VideoMAEConfig(
    image_size=64, patch_size=16, num_frames=8, tubelet_size=2, hidden_size=32,
    num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=4,
)  # fmt: skip
videomae = camkit.InputLayout(VideoMAEForVideoClassification(config).eval(), "BTCHW")
cam = camkit.GradCAM(videomae, output="logits")
heat = cam(clip, target=1)  # (1, T, H, W): one map per input frame
print("VideoMAE layer:", cam.layers[0])
print("  read as:", cam.layouts[cam.layers[0]])
print("  per-frame importance:", np.round(metrics.frame_importance(heat)[0].numpy(), 3))

# a 3-D CNN: its default layer4 strides time by 8 (one step for 8 frames, the same share for
# every frame), so layer2 (4 steps) says more about when; the model's own answer: frame_drop
model = r3d_18(num_classes=4).eval()
heat = camkit.GradCAM(model, "layer2")(clip, target=1)
importance = metrics.frame_importance(heat)[0]
drop = metrics.frame_drop(model, clip, target=1)[0]
print("r3d_18 importance:", np.round(importance.numpy(), 3))
print("r3d_18 score drop without each frame:", np.round(drop.numpy(), 4))

# the animated overlay (one frame per input frame) and the importance plot
frames = (clip[0].permute(1, 2, 3, 0).numpy() * 255).astype(np.uint8)  # (T, H, W, 3)
drawn = overlay_frames(frames, heat[0])
video.save_gif("video_overlay.gif", drawn, fps=4)
video.save_mp4("video_overlay.mp4", drawn, fps=4)
camkit.io.write_atomic("video_frames.png", importance_plot(importance, fps=4, drop=drop))
print("wrote video_overlay.gif, video_overlay.mp4 and video_frames.png")

# a frame-wise model (an image CNN run on every frame, scores averaged: TSN): Score-CAM masks
# each channel's frame maps over the whole clip, one map per frame
image_model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(), torch.nn.Linear(8, 4),
).eval()  # fmt: skip
loaded = models.LoadedModel(
    name="tiny", model=image_model, preprocess=models.Preprocess(64), labels=list("abcd"),
    default_layer="1", input_size=(64, 64),
)  # fmt: skip
per_frame = models.frame_wise(loaded, clip_length=8).model
heat = camkit.ScoreCAM(per_frame)(clip, target=1)
print("frame-wise Score-CAM:", tuple(heat.shape), "importance", np.round(
    metrics.frame_importance(heat)[0].numpy(), 3))  # fmt: skip

# concepts: which of r3d_18's layer2 channels carry the class, and where in each frame
concepts = ConceptAttribution(model, "layer2")
top = concepts.top(clip, k=3, target=1)
print("r3d_18 layer2 top channels:", top.channels.tolist(), "heatmaps", tuple(top.heatmaps.shape))

# X-CLIP: its vision tower runs the frames as a batch (read from its config), its text side
# depends on the video: explain its own video-text logits, one map per frame for a prompt
vision = dict(
    image_size=64, patch_size=16, num_frames=8, hidden_size=32, intermediate_size=64,
    num_attention_heads=2, num_hidden_layers=2, mit_hidden_size=16, mit_intermediate_size=32,
    mit_num_hidden_layers=1, mit_num_attention_heads=2,
)  # fmt: skip
text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            vocab_size=32, max_position_embeddings=16)  # fmt: skip
xclip = XCLIPModel(XCLIPConfig(text_config=text, vision_config=vision, projection_dim=16,
                               prompt_layers=1, prompt_num_attention_heads=2)).eval()  # fmt: skip
prompts = torch.tensor([[1, 5, 6, 3], [1, 5, 7, 3]])  # two prompts' token ids
cam = camkit.GradCAM(camkit.InputLayout(camkit.VideoPrompts(xclip, prompts), "BTCHW"))
heat = cam(clip, target=0)  # (1, T, H, W) for prompt 0
print("X-CLIP layer:", cam.layers[0], "map", tuple(heat.shape))
