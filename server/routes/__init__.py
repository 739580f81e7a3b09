"""The service routes around the APIs: health, props and models, tokenize, the slots and
their files, the web page, and what a load balancer asks a replica."""
