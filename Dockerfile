# Rankboard on a GPU node: the PyTorch image brings torch with CUDA and NCCL, and Rankboard reuses that torch.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
WORKDIR /opt/rankboard
COPY . .
RUN pip install --no-cache-dir -e .
EXPOSE 8000
CMD ["rankboard", "serve", "--host", "0.0.0.0", "--port", "8000"]
