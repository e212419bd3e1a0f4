from setuptools import find_packages, setup

version = {}
with open('swin_rpe_plugin/version.py') as f:
    exec(f.read(), version)

setup(
    name='swin_rpe_plugin',
    version=version['__version__'],
    description='Swin Transformer backbone with 2D relative position bias for mmdet and mmseg',
    long_description=open('README.md').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    # Only the package itself: tests/ and configs/ must not become top-level packages.
    packages=find_packages(include=['swin_rpe_plugin', 'swin_rpe_plugin.*']),
    install_requires=['torch>=2.1', 'mmengine>=0.10', 'mmcv>=2.0.0,<2.2.0', 'safetensors'],
    license='Apache-2.0',
)
