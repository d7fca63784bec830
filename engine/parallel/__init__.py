"""Tensor parallel ranks."""
