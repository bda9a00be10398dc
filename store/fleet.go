package store

// Claim is one replica's claim on one group: a capacity that the replicas
// of a fleet share (an RLQS limit), divided max-min fairly over every
// replica's demands. quota.Fleet exchanges claims; store/redis's Demand
// holds them. It is plain data.
type Claim struct {
	// Capacity is what the fleet divides: the limit less the reserve.
	Capacity float64
	// Max bounds the part claimed: a replica's first claim of a group
	// takes at most an equal part per live replica, since the replicas
	// that got the group at the same time have not published yet.
	Max float64
	// Demands are the demands of this replica's proxies.
	Demands []float64
}

// Grants is the outcome of one exchange of claims with the fleet. It is
// plain data.
type Grants struct {
	// Granted is this replica's part of each group whose claim succeeded.
	Granted map[string]float64
	// Live is the number of replicas alive in the fleet, this one
	// included; 0 when unknown (the membership could not be read).
	Live int
}
