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
    # The floor of mmdet 3.3's own install guide (Python 3.8, torch 2.1, mmcv 2.1.0's wheels);
    # swin_rpe_plugin/compat.py names the same torch floor on import.
    python_requires='>=3.8',
    # Only the package itself: tests/ and configs/ must not become top-level packages.
    packages=find_packages(include=['swin_rpe_plugin', 'swin_rpe_plugin.*']),
    install_requires=['torch>=2.1', 'mmengine>=0.10', 'mmcv>=2.0.0,<2.2.0', 'safetensors'],
    license='Apache-2.0',
)
