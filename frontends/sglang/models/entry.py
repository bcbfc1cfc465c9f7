"""SGLang EntryClass: one model class per architecture of atom_core's model registry (the list form SGLang's
`import_model_classes` accepts). Imported while SGLang's model registry initialises: keep imports light."""

from atom_core.models import supported_architectures
from atom_frontends.sglang.wrapper import entry_class

EntryClass = [entry_class(architecture) for architecture in supported_architectures()]
