module example.com/go-consumer

go 1.19

require github.com/cocoonstack/cocoon-fixup/go/cocoonfixup v0.0.0

replace github.com/cocoonstack/cocoon-fixup/go/cocoonfixup => ../../go/cocoonfixup
