package maintenance

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestStopReportsItsContextOnlyWhenItCutAPass: a Stop between passes
// returns nil whatever its context; one that cuts a pass short returns the
// context's error once the pass has returned.
func TestStopReportsItsContextOnlyWhenItCutAPass(t *testing.T) {
	t.Parallel()
	ended, cancel := context.WithCancel(context.Background())
	cancel()

	var idle background
	passed := make(chan struct{}, 1)
	err := idle.Start(context.Background(), "idle", func(context.Context) time.Duration {
		passed <- struct{}{}
		return time.Hour
	})
	if err != nil {
		t.Fatal(err)
	}
	<-passed
	// The pass has sent; wait for the loop to record that it ended.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		idle.mu.Lock()
		passing := idle.passing
		idle.mu.Unlock()
		if !passing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pass never ended")
		}
	}
	if err := idle.Stop(ended); err != nil {
		t.Errorf("Stop between passes: %v, want nil", err)
	}

	var busy background
	running, returned := make(chan struct{}), make(chan struct{})
	err = busy.Start(context.Background(), "busy", func(ctx context.Context) time.Duration {
		close(running)
		<-ctx.Done()
		close(returned)
		return time.Hour
	})
	if err != nil {
		t.Fatal(err)
	}
	<-running
	if err := busy.StopGracefully(ended); !errors.Is(err, context.Canceled) {
		t.Errorf("Stop during a pass with an ended context: %v, want context.Canceled", err)
	}
	select {
	case <-returned:
	default:
		t.Error("Stop returned before the pass it cut did")
	}
	if err := busy.Stop(ended); err != nil {
		t.Errorf("second Stop: %v, want nil", err)
	}
}
