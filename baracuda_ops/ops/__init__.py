"""One module per op family: public function, fake, autograd and Plan classes."""
