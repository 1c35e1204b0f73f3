"""Tests of Hugging Face kernels, transformers and serving against our builds."""
