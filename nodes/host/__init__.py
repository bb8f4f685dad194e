"""What the pack reads from or hands to the running ComfyUI: versions and model identity, public text, routes, noise.

:mod:`.identity` reads the running server (versions, settings, the model's file and digest) for run records;
:mod:`.public_text` shows ComfyUI's folders instead of absolute paths in everything that leaves the server;
:mod:`.routes` adds the HTTP route; :mod:`.noise` asks the running ComfyUI how it draws KSampler's initial noise and
holds the table of how its samplers draw per-step noise (what the Seeded Sampler hands them).
"""
